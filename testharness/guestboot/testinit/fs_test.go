//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

func noDropCaches(t *testing.T) {
	old := dropCaches
	dropCaches = func() error { return nil }
	t.Cleanup(func() { dropCaches = old })
}

// marks records the workloads' marks.
type marks []string

func (m *marks) mark(metric string, begin bool) { *m = append(*m, fsbench.MarkLine(metric, begin)) }

func TestSeqAndRandWorkloads(t *testing.T) {
	noDropCaches(t)
	path := filepath.Join(t.TempDir(), fsbench.FileName)
	var seen marks
	v, err := seqWorkload(path, 3, seen.mark)
	require.NoError(t, err)
	require.Equal(t, marks{fsbench.MarkLine("seq_write", true), fsbench.MarkLine("seq_write", false),
		fsbench.MarkLine("seq_read", true), fsbench.MarkLine("seq_read", false)}, seen, "each timed part is marked, in order")
	require.Equal(t, int64(3*fsbench.BlockSize), v["bytes"])
	require.Positive(t, v["write_ns"])
	require.Positive(t, v["read_ns"])
	require.Positive(t, v["ram_read_ns"], "the read from RAM is timed")

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, data, 3*fsbench.BlockSize)
	want := make([]byte, fsbench.BlockSize)
	fsbench.FillPattern(want)
	fsbench.StampBlock(want, 2)
	require.Equal(t, want, data[2*fsbench.BlockSize:], "the last block is stamped with its number")

	seen = nil
	v, err = randWorkload(path, 3, 50, seen.mark)
	require.Equal(t, marks{fsbench.MarkLine("rand_read", true), fsbench.MarkLine("rand_read", false)}, seen)
	require.NoError(t, err)
	require.Equal(t, int64(50), v["reads"])
	require.Positive(t, v["ns"])

	for i := range data { // every byte wrong: the first random read fails
		data[i] ^= 0x55
	}
	require.NoError(t, os.WriteFile(path, data, 0o644))
	_, err = randWorkload(path, 3, 50, nil)
	require.ErrorContains(t, err, "differs")
}

func TestSeqWorkloadFailsWhereItCannotWrite(t *testing.T) {
	noDropCaches(t)
	_, err := seqWorkload(filepath.Join(t.TempDir(), "missing", fsbench.FileName), 1, nil)
	require.Error(t, err)
}

func TestWalkWorkload(t *testing.T) {
	noDropCaches(t)
	tree := filepath.Join(t.TempDir(), fsbench.TreeDir)
	for i := range 3 {
		dir := filepath.Join(tree, fsbench.TreeDirName(i))
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for j := range 4 {
			require.NoError(t, os.WriteFile(filepath.Join(dir, fsbench.TreeFileName(j)), fsbench.TreeFileContent(i, j), 0o644))
		}
	}
	require.NoError(t, os.MkdirAll(filepath.Join(tree, ".git", "objects"), 0o755), "not walked")
	var seen marks
	v, err := walkWorkload(tree, 3, 4, seen.mark)
	require.Equal(t, marks{fsbench.MarkLine("walk_cold", true), fsbench.MarkLine("walk_cold", false),
		fsbench.MarkLine("walk_warm", true), fsbench.MarkLine("walk_warm", false)}, seen)
	require.NoError(t, err)
	require.Equal(t, int64(12), v["files"])
	require.Positive(t, v["cold_ns"])
	require.Positive(t, v["warm_ns"])

	_, err = walkWorkload(tree, 3, 5, nil)
	require.ErrorContains(t, err, "holds 3 directories and 12 files")
}

func TestFSModeOffAndBadConfig(t *testing.T) {
	var out strings.Builder
	require.False(t, fsMode("console=ttyS0 quiet", &out))
	require.Empty(t, out.String())

	require.True(t, fsMode("console=ttyS0 "+fsbench.KeyWorkloads+"=seq "+fsbench.KeyMiB+"=0", &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2)
	r, ok, err := fsbench.ParseLine(lines[0])
	require.True(t, ok)
	require.NoError(t, err)
	require.NotEmpty(t, r.Err)
	require.Equal(t, fsbench.EndMarker, lines[1])
}

func TestRawDiskIsTheSeqFile(t *testing.T) {
	noDropCaches(t)
	old := deviceWait
	deviceWait = 10 * time.Millisecond
	t.Cleanup(func() { deviceWait = old })
	// Without the disk, every workload reports the error.
	var out strings.Builder
	require.True(t, fsMode(fsbench.Config{Workloads: fsbench.BlockWorkloads, Data: fsbench.Mount{Type: fsbench.TypeBlock, Tag: "cowork-no-such-disk"},
		MiB: 1, RandReads: 1, Dirs: 1, FilesPerDir: 1}.Cmdline(), &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3)
	for _, line := range lines[:2] {
		r, ok, err := fsbench.ParseLine(line)
		require.True(t, ok)
		require.NoError(t, err)
		require.Contains(t, r.Err, "no disk", line)
	}
	require.ErrorContains(t, waitForDevice("/dev/null"), "not a block device")

	// seq and rand write and read the disk itself: here, a file of its size.
	disk := filepath.Join(t.TempDir(), "vda")
	require.NoError(t, os.WriteFile(disk, make([]byte, 2*fsbench.BlockSize), 0o644))
	e := &fsEnv{cfg: fsbench.Config{MiB: 2, RandReads: 20}, seqFile: disk}
	for _, w := range fsbench.BlockWorkloads {
		r := e.run(w)
		require.Empty(t, r.Err, w)
		require.NotEmpty(t, r.Values, w)
	}
	data, err := os.ReadFile(disk)
	require.NoError(t, err)
	want := make([]byte, fsbench.BlockSize)
	fsbench.FillPattern(want)
	fsbench.StampBlock(want, 1)
	require.Equal(t, want, data[fsbench.BlockSize:], "the disk holds the stamped blocks")
}

func TestRunWithoutRootSkips(t *testing.T) {
	e := &fsEnv{cfg: fsbench.Config{Dirs: 1, FilesPerDir: 1}}
	for _, w := range []string{fsbench.WorkloadGit, fsbench.WorkloadPython} {
		r := e.run(w)
		require.Equal(t, "no host root is shared", r.Skip, w)
	}
	require.NotEmpty(t, e.run(fsbench.WorkloadRand).Skip, "rand without seq's file")
}
