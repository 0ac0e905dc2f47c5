package doctor

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/helper"
)

// Profile directory names as the helper makes them (name-<hash>).
const (
	profileA = "a-0123456789abcdef"
	profileB = "b-fedcba9876543210"
)

// makeRootDisk makes profile's root disk in dataDir as the helper does
// (sparse, 64 MiB) with written bytes of data at its start, and returns
// its path.
func makeRootDisk(t *testing.T, dataDir, profile string, written int) string {
	t.Helper()
	path := rootDiskPath(dataDir, profile)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte{1}, written), 0o600))
	require.NoError(t, os.Truncate(path, 64<<20))
	return path
}

// lockRootDisk holds path's lock as a running VM does, until the test ends.
func lockRootDisk(t *testing.T, path string) {
	t.Helper()
	f, err := helper.OpenRootDisk(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
}

// allocated is the host bytes path's blocks take.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Blocks * 512
}

// runOn runs doctor on the healthy fake host with its data directory at
// dataDir and root disks listed from it for real.
func runOn(t *testing.T, dataDir string) Report {
	t.Helper()
	h := healthyHost().host()
	h.DataDir = func() (string, error) { return dataDir, nil }
	h.RootDisks = ListRootDisks
	return Run(context.Background(), Options{Host: h})
}

// TestRootDiskCheckListsEachDisk: two profiles, one disk locked as a
// running VM holds it: each is listed with its size, what it takes on the
// host and whether it is in use; listing leaves the free one free.
func TestRootDiskCheckListsEachDisk(t *testing.T) {
	data := t.TempDir()
	inUse := makeRootDisk(t, data, profileA, 1<<20)
	free := makeRootDisk(t, data, profileB, 0)
	lockRootDisk(t, inUse)

	disks, err := ListRootDisks(data)
	require.NoError(t, err)
	require.Len(t, disks, 2)
	assert.Equal(t, RootDisk{Profile: profileA, Path: inUse, Size: 64 << 20, Allocated: allocated(t, inUse), InUse: true}, disks[0])
	assert.Equal(t, RootDisk{Profile: profileB, Path: free, Size: 64 << 20, Allocated: allocated(t, free)}, disks[1])
	assert.GreaterOrEqual(t, disks[0].Allocated, int64(1<<20))

	c := wantStatus(t, runOn(t, data), CheckRootDisks, StatusOK)
	wantContains(t, "detail", c.Detail, filepath.Join(data, "profiles"),
		profileA+"/root.img 64.0 MiB", "in use by a running VM",
		profileB+"/root.img 64.0 MiB, 0 KiB on the host, not in use", "--reset-root")
	f, err := helper.OpenRootDisk(free)
	require.NoError(t, err, "doctor let go of the free disk")
	require.NoError(t, f.Close())
}

// TestRootDiskCheckNone: no profiles directory, or profiles without
// disks, is no failure.
func TestRootDiskCheckNone(t *testing.T) {
	data := t.TempDir()
	c := wantStatus(t, runOn(t, data), CheckRootDisks, StatusOK)
	assert.Contains(t, c.Detail, "none in")
	require.NoError(t, os.MkdirAll(filepath.Join(data, "profiles", profileA, "sessions"), 0o700))
	c = wantStatus(t, runOn(t, data), CheckRootDisks, StatusOK)
	assert.Contains(t, c.Detail, "none in")

	f := healthyHost()
	f.env[helper.RootDiskEnv] = "off"
	c = wantStatus(t, f.run(t, Options{}), CheckRootDisks, StatusOK)
	wantContains(t, "detail", c.Detail, "none in", helper.RootDiskEnv+"=off")
}

// TestRootDiskCheckSymlink: a symlink where a disk belongs is reported,
// not followed; a symlinked profile directory is no profile.
func TestRootDiskCheckSymlink(t *testing.T) {
	data, outside := t.TempDir(), t.TempDir()
	target := makeRootDisk(t, outside, profileA, 0)
	require.NoError(t, os.MkdirAll(filepath.Join(data, "profiles", profileA), 0o700))
	require.NoError(t, os.Symlink(target, rootDiskPath(data, profileA)))
	require.NoError(t, os.Symlink(filepath.Dir(target), filepath.Join(data, "profiles", profileB)))

	disks, err := ListRootDisks(data)
	require.NoError(t, err)
	require.Len(t, disks, 1)
	assert.Equal(t, profileA, disks[0].Profile)
	assert.Contains(t, disks[0].Err, "not followed")
	c := wantStatus(t, runOn(t, data), CheckRootDisks, StatusWarn)
	assert.NotEmpty(t, c.Fix)
}

// TestResetRootRemovesAFreeDisk: the disk goes, with the bytes it took;
// the other profile's stays.
func TestResetRootRemovesAFreeDisk(t *testing.T) {
	data := t.TempDir()
	path := makeRootDisk(t, data, profileA, 1<<20)
	other := makeRootDisk(t, data, profileB, 0)
	want := allocated(t, path)

	resets, err := ResetRoot(data, profileA)
	require.NoError(t, err)
	require.Equal(t, []Reset{{Profile: profileA, Path: path, Freed: want}}, resets)
	assert.NoFileExists(t, path)
	assert.DirExists(t, filepath.Dir(path), "only the disk goes")
	assert.FileExists(t, other)

	resets, err = ResetRoot(data, profileA)
	require.NoError(t, err)
	assert.Empty(t, resets, "nothing left to reset")
}

// TestResetRootRefusesADiskInUse: a locked disk stays; with "all" the
// free ones still go.
func TestResetRootRefusesADiskInUse(t *testing.T) {
	data := t.TempDir()
	inUse := makeRootDisk(t, data, profileA, 4096)
	free := makeRootDisk(t, data, profileB, 4096)
	lockRootDisk(t, inUse)

	resets, err := ResetRoot(data, profileA)
	require.NoError(t, err)
	require.Len(t, resets, 1)
	assert.ErrorIs(t, resets[0].Err, helper.ErrRootDiskInUse)
	assert.FileExists(t, inUse)

	resets, err = ResetRoot(data, ResetAll)
	require.NoError(t, err)
	require.Len(t, resets, 2)
	assert.ErrorIs(t, resets[0].Err, helper.ErrRootDiskInUse)
	assert.NoError(t, resets[1].Err)
	assert.FileExists(t, inUse)
	assert.NoFileExists(t, free)
}

// TestResetRootFollowsNoSymlink: a symlinked disk or profile directory is
// refused, by name or with "all", and what it points to stays.
func TestResetRootFollowsNoSymlink(t *testing.T) {
	data, outside := t.TempDir(), t.TempDir()
	target := makeRootDisk(t, outside, "elsewhere", 4096)
	require.NoError(t, os.MkdirAll(filepath.Join(data, "profiles", profileA), 0o700))
	link := rootDiskPath(data, profileA)
	require.NoError(t, os.Symlink(target, link))
	require.NoError(t, os.Symlink(filepath.Dir(target), filepath.Join(data, "profiles", profileB)))

	for _, profile := range []string{profileA, profileB} {
		resets, err := ResetRoot(data, profile)
		require.NoError(t, err)
		require.Len(t, resets, 1, profile)
		assert.ErrorContains(t, resets[0].Err, "not followed", profile)
	}
	resets, err := ResetRoot(data, ResetAll)
	require.NoError(t, err)
	require.Len(t, resets, 1, "the symlinked profile directory is no profile")
	assert.Error(t, resets[0].Err)
	assert.FileExists(t, target)
	_, err = os.Lstat(link)
	assert.NoError(t, err, "the symlink is refused, not removed")
}

// TestResetRootRejectsBadNames: nothing that could reach past the
// profiles directory is taken for a profile.
func TestResetRootRejectsBadNames(t *testing.T) {
	data := t.TempDir()
	makeRootDisk(t, data, profileA, 0)
	for _, name := range []string{"", ".", "..", "../x", "a/b", profileA + "/..", "/etc", "x\x00"} {
		_, err := ResetRoot(data, name)
		assert.ErrorContains(t, err, "is not a profile", "%q", name)
	}
	resets, err := ResetRoot(data, "no-such-profile")
	require.NoError(t, err, "a good name: the Reset says what became of it")
	require.Len(t, resets, 1)
	assert.ErrorContains(t, resets[0].Err, "the profile's directory: no such file or directory")
	assert.FileExists(t, rootDiskPath(data, profileA))
}

// TestResetRootMain: the flag prints what it removed and the bytes freed
// and exits 0; a disk in use exits 1 saying to stop the VM; a bad name is
// a usage error; --help describes it.
func TestResetRootMain(t *testing.T) {
	data := t.TempDir()
	host := healthyHost().host()
	host.DataDir = func() (string, error) { return data, nil }
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := runMain(context.Background(), args, &out, &errOut, host)
		return code, out.String(), errOut.String()
	}

	code, out, _ := run("--reset-root", ResetAll)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "no root disk to remove")

	path := makeRootDisk(t, data, profileA, 8192)
	freed := allocated(t, path)
	code, out, _ = run("--reset-root", profileA)
	assert.Equal(t, 0, code)
	wantContains(t, "stdout", out, "removed "+path, "bytes)")
	assert.Contains(t, out, "("+strconv.FormatInt(freed, 10)+" bytes)")
	assert.NotContains(t, out, "Verdict", "no report")

	lockRootDisk(t, makeRootDisk(t, data, profileB, 0))
	code, _, errOut := run("--reset-root", profileB)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "stop the VM first")

	code, _, errOut = run("--reset-root", "../"+profileB)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "is not a profile")
	code, _, _ = run("--reset-root", "")
	assert.Equal(t, 2, code, "an empty PROFILE is a bad name")

	code, _, errOut = run("--help")
	assert.Equal(t, 0, code)
	wantContains(t, "--help", errOut, "--reset-root PROFILE", "clean root", "stop the VM first")
}
