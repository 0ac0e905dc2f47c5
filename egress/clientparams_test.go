package egress

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// TestClientAllowedDomainsAbsentVersusEmpty guards the distinction the
// policy relies on: the client's "allowedDomains": [] must decode to a
// non-nil slice (enforced, refuse all) and an absent field to nil (allow all).
func TestClientAllowedDomainsAbsentVersusEmpty(t *testing.T) {
	var empty, absent, listed protocol.ClientSpawnParams
	require.NoError(t, json.Unmarshal([]byte(`{"id":"a","allowedDomains":[]}`), &empty))
	require.NoError(t, json.Unmarshal([]byte(`{"id":"a"}`), &absent))
	require.NoError(t, json.Unmarshal([]byte(`{"id":"a","allowedDomains":["*.example.com"]}`), &listed))

	require.False(t, ParsePolicy(empty.AllowedDomains).AllowsAll())
	require.False(t, ParsePolicy(empty.AllowedDomains).Allows("example.com"))
	require.True(t, ParsePolicy(absent.AllowedDomains).AllowsAll())
	require.True(t, ParsePolicy(listed.AllowedDomains).Allows("api.example.com"))
}
