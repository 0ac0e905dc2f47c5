package helper

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// TestSessionUIDs: one uid per session, the same each time, distinct
// between sessions, all valid session uids; none past the range.
func TestSessionUIDs(t *testing.T) {
	var u sessionUIDs
	a, err := u.of("a")
	require.NoError(t, err)
	b, err := u.of("b")
	require.NoError(t, err)
	again, err := u.of("a")
	require.NoError(t, err)
	assert.Equal(t, a, again, "the same session, the same uid")
	assert.NotEqual(t, a, b)
	assert.True(t, protocol.ValidSessionUID(a) && protocol.ValidSessionUID(b))

	full := sessionUIDs{byName: map[string]uint32{}}
	for i := range protocol.MaxSessionUIDs {
		full.byName[strconv.Itoa(i)] = uint32(protocol.FirstSessionUID + i)
	}
	_, err = full.of("one more")
	assert.ErrorIs(t, err, errNoSessionUID)
}

// TestSessionOfTarget: the session a mount target lies in, and whether
// below its home.
func TestSessionOfTarget(t *testing.T) {
	for target, want := range map[string]struct {
		session   string
		inner, ok bool
	}{
		"/sessions/s":          {"s", false, true},
		"/sessions/s/mnt/work": {"s", true, true},
		"/sessions/s/":         {"s", false, true},
		"/sessions":            {"", false, false},
		"/opt/sdk":             {"", false, false},
		"/sessionsx/s":         {"", false, false},
	} {
		session, inner, ok := sessionOfTarget(target)
		assert.Equal(t, want.session, session, target)
		assert.Equal(t, want.inner, inner, target)
		assert.Equal(t, want.ok, ok, target)
	}
}

// TestSpawnCarriesSessionUID: the agent gets each spawn's session uid, the
// same for spawns of one session, another for another session.
func TestSpawnCarriesSessionUID(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	e.spawn(map[string]any{"id": "a1", "name": "a", "command": "/bin/true"})
	e.spawn(map[string]any{"id": "a2", "name": "a", "command": "/bin/true"})
	e.spawn(map[string]any{"id": "b1", "name": "b", "command": "/bin/true"})
	a1, _ := g.agent.spawned("a1")
	a2, _ := g.agent.spawned("a2")
	b1, _ := g.agent.spawned("b1")
	assert.True(t, protocol.ValidSessionUID(a1.UID), "uid %d", a1.UID)
	assert.Equal(t, a1.UID, a2.UID, "one session, one uid")
	assert.NotEqual(t, a1.UID, b1.UID, "another session, another uid")
}
