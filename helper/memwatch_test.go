package helper

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadHostMemory parses a meminfo file and refuses one without a total.
func TestReadHostMemory(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "meminfo")
	require.NoError(t, os.WriteFile(good, []byte("MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    1000000 kB\n"), 0o644))
	m, err := readHostMemory(good)
	require.NoError(t, err)
	assert.Equal(t, hostMemory{availableKiB: 1000000, totalKiB: 16000000}, m)
	assert.True(t, m.short(), "6% available is short")
	assert.False(t, m.roomy())
	assert.True(t, hostMemory{availableKiB: 5, totalKiB: 10}.roomy())
	assert.False(t, hostMemory{availableKiB: 15, totalKiB: 100}.short(), "15% is neither short")
	assert.False(t, hostMemory{availableKiB: 15, totalKiB: 100}.roomy(), "nor roomy")

	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("MemAvailable: 5 kB\n"), 0o644))
	_, err = readHostMemory(bad)
	assert.ErrorContains(t, err, "no MemTotal")
	require.NoError(t, os.WriteFile(bad, []byte("MemTotal: lots kB\n"), 0o644))
	_, err = readHostMemory(bad)
	assert.Error(t, err)
}

// TestBalanceMemory: a short host asks an idle guest for memory once, not a
// busy one; room again, or a spawn, gives it back.
func TestBalanceMemory(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	short, roomy := hostMemory{availableKiB: 5, totalKiB: 100}, hostMemory{availableKiB: 50, totalKiB: 100}

	e.h.balanceMemory(short)
	e.h.balanceMemory(short)
	reclaims, releases := g.memoryCalls()
	assert.Equal(t, [2]int{1, 0}, [2]int{reclaims, releases}, "an idle guest is asked once per short spell")
	e.h.balanceMemory(roomy)
	reclaims, releases = g.memoryCalls()
	assert.Equal(t, [2]int{1, 1}, [2]int{reclaims, releases}, "room again: it has its memory back")

	e.h.balanceMemory(short)
	e.spawn(map[string]any{"id": "p", "name": "s", "command": "/bin/sleep", "args": []string{"100"}})
	reclaims, releases = g.memoryCalls()
	assert.Equal(t, [2]int{2, 2}, [2]int{reclaims, releases}, "a spawn gives it back at once")
	e.h.balanceMemory(short)
	reclaims, _ = g.memoryCalls()
	assert.Equal(t, 2, reclaims, "a guest running a process is not asked")
}
