package vm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeState writes a suspended state's files as a save at generation
// gen with the disk's identity now.
func writeState(t *testing.T, dir string, gen uint64, disks ...string) {
	t.Helper()
	raw, err := json.Marshal(suspendMeta{Nonce: "n", Generation: gen, Disks: disks, Disk: disksIdentity(disks), SavedAt: time.Now()})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, suspendedMeta), raw, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, suspendedSnapshot), []byte("snap"), 0o600))
}

// Every boot moves the profile to a new generation, durably, before the
// VM runs; a state is the candidate to resume only for the boot right
// after the one that saved it, and only onto the disk it was saved with.
func TestSuspendPlanGenerations(t *testing.T) {
	dir := t.TempDir()
	disk, err := os.Create(filepath.Join(dir, "root.img"))
	require.NoError(t, err)
	defer disk.Close()

	disks := []string{disk.Name()}
	first := &suspendPlan{dir: dir, disks: disks}
	require.NoError(t, first.begin())
	assert.EqualValues(t, 1, first.generation)
	assert.Nil(t, first.candidate, "no state yet")
	gen, err := readGeneration(dir)
	require.NoError(t, err)
	assert.EqualValues(t, 1, gen, "written before the VM runs")

	writeState(t, dir, first.generation, disks...) // boot 1 suspended
	second := &suspendPlan{dir: dir, disks: disks}
	require.NoError(t, second.begin())
	require.NotNil(t, second.candidate, "the state of the boot before")
	assert.EqualValues(t, 2, second.generation)

	// The state is spent even if its files stay: the profile moved on.
	third := &suspendPlan{dir: dir, disks: disks}
	require.NoError(t, third.begin())
	assert.Nil(t, third.candidate, "a state of an older generation is stale")

	writeState(t, dir, third.generation, disks...)
	_, err = disk.Write([]byte("written by someone else"))
	require.NoError(t, err)
	fourth := &suspendPlan{dir: dir, disks: disks}
	require.NoError(t, fourth.begin())
	assert.Nil(t, fourth.candidate, "the disk changed since the save")
	fourth.discard()
	for _, f := range []string{suspendedMeta, suspendedSnapshot} {
		assert.NoFileExists(t, filepath.Join(dir, f))
	}
}

// A damaged generation file is an error: the boot then cannot suspend
// (it could not make a later state stale).
func TestSuspendPlanDamagedGeneration(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, generationFile), []byte("x\n"), 0o600))
	p := &suspendPlan{dir: dir}
	require.ErrorContains(t, p.begin(), "damaged")
}

// doctor's view: a current state, and why another is not resumed.
func TestSuspendedStates(t *testing.T) {
	profiles := t.TempDir()
	cur, stale := filepath.Join(profiles, "a"), filepath.Join(profiles, "b")
	for _, d := range []string{cur, stale} {
		require.NoError(t, os.MkdirAll(d, 0o700))
		require.NoError(t, writeGeneration(d, 5))
	}
	disk := filepath.Join(cur, "root.img")
	require.NoError(t, os.WriteFile(disk, []byte("disk"), 0o600))
	writeState(t, cur, 5, disk)
	writeState(t, stale, 4)
	states := SuspendedStates(profiles)
	require.Len(t, states, 2)
	assert.Equal(t, "a", states[0].Profile)
	assert.Empty(t, states[0].Unusable)
	assert.Positive(t, states[0].Bytes)
	assert.Contains(t, states[1].Unusable, "ran after it was saved")

	future := time.Now().Add(time.Hour)
	require.NoError(t, os.Chtimes(disk, future, future))
	assert.Contains(t, SuspendedStates(profiles)[0].Unusable, "disks changed")
}
