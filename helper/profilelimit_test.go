package helper

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// A pipe whose configure was refused (the profile limit) refuses every
// later call with the same error: its spawn never runs in another
// profile's guest (the last configured one's, which it used to fall back
// on).
func TestARefusedConfigureRefusesItsPipe(t *testing.T) {
	backend := &fakeBackend{t: t}
	h := newHelper(t, t.TempDir(), backend)
	var last context.Context
	for i := range maxProfiles {
		last = configured(t, h, fmt.Sprintf("p%d", i), "/root")
	}
	startOn(t, h, last) // the last configured profile has a running guest
	victim := backend.last()

	pipe := protocol.WithConnState(context.Background())
	refused := callOn(t, h, pipe, "configure", map[string]any{"userDataName": "one-too-many", "userDataRoot": "/root", "sessionOnly": true}, nil)
	require.ErrorContains(t, refused, "limit")

	err := callOn(t, h, pipe, "spawn", map[string]any{"id": "intruder", "name": "s", "command": "sh"}, nil)
	assert.EqualError(t, err, refused.Error(), "the refused pipe's spawn")
	_, spawned := victim.agent.spawned("intruder")
	assert.False(t, spawned, "the refused pipe's spawn ran in another profile's guest")
	err = callOn(t, h, pipe, "configure", map[string]any{"userDataName": "p0", "userDataRoot": "/root", "sessionOnly": true}, nil)
	assert.EqualError(t, err, refused.Error(), "a refused pipe stays refused")
}

// Calls before any configure act on the default profile, which takes no
// place of the client's profiles.
func TestTheDefaultProfileTakesNoProfileSlot(t *testing.T) {
	h := newHelper(t, t.TempDir(), &fakeBackend{t: t})
	require.NoError(t, callOn(t, h, context.Background(), "isRunning", nil, nil), "a one-shot call before any configure")
	for i := range maxProfiles {
		configured(t, h, fmt.Sprintf("p%d", i), "/root")
	}
	pipe := protocol.WithConnState(context.Background())
	err := callOn(t, h, pipe, "configure", map[string]any{"userDataName": "one-too-many", "userDataRoot": "/root", "sessionOnly": true}, nil)
	assert.ErrorContains(t, err, "limit", "the limit still holds")
}
