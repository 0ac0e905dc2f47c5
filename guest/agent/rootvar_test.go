package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// withStagingDir makes the agent's staging directory for a test in a
// private mount namespace (the VM's agent has it on its own root), and
// removes it afterwards if the test made it.
func withStagingDir(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	if _, err := os.Lstat(stagingDir); err == nil {
		return
	}
	require.NoError(t, os.Mkdir(stagingDir, 0o700))
	t.Cleanup(func() { os.RemoveAll(stagingDir) })
}

// TestSetUpVar: the root disk's var/ becomes /var with its skeleton, and
// /var/lib/dpkg the overlay of the host's package database (a directory
// stands in for the device) whose changes land in the disk's upper layer;
// a symlink a session planted in var/ is refused, not followed.
func TestSetUpVar(t *testing.T) {
	withStagingDir(t)
	dev, disk, planted, outside := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	pkgdb := filepath.Join(dev, "pkgdb")
	require.NoError(t, os.MkdirAll(filepath.Join(pkgdb, "info"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(pkgdb, "status"), []byte("Package: base\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(planted, "var"), 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(planted, "var", "cache")))
	src := &protocol.MountSource{Kind: protocol.MountKindVirtioFS, Tag: "cowork-sys", Aname: "pkgdb"}

	var res struct {
		plantedErr, err, write error
		tmpMode                os.FileMode
		status                 []byte
		system                 []string
	}
	inMountNamespace(t, func() {
		m := newMounter(slog.New(slog.DiscardHandler), true)
		defer m.close()
		root, err := os.Open(dev)
		if res.err = err; err != nil {
			return
		}
		m.devices[deviceKey{protocol.MountKindVirtioFS, "cowork-sys"}] = deviceMount{root: root}
		res.plantedErr = m.setUpVar(planted, nil, newStepTimer())
		if res.err = m.setUpVar(disk, src, newStepTimer()); res.err != nil {
			return
		}
		defer unix.Unmount(varTarget, unix.MNT_DETACH)
		defer unix.Unmount(packageDBTarget, unix.MNT_DETACH)
		defer unix.Unmount(packageDBLower, unix.MNT_DETACH)
		if st, err := os.Stat("/var/tmp"); err == nil {
			res.tmpMode = st.Mode()
		}
		res.status, _ = os.ReadFile("/var/lib/dpkg/status")
		res.write = os.WriteFile("/var/lib/dpkg/status", []byte("Package: base\n\nPackage: coworkdeb\n"), 0o644)
		res.system = m.system
	})
	require.ErrorIs(t, res.plantedErr, unix.ELOOP, "a planted var/cache symlink")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing made through the planted symlink")
	require.NoError(t, res.err)
	assert.Equal(t, os.ModeDir|os.ModeSticky|0o777, res.tmpMode, "/var/tmp")
	assert.Equal(t, "Package: base\n", string(res.status), "the host's database is the lower layer")
	require.NoError(t, res.write)
	assert.Contains(t, res.system, varTarget, "isolated spawns get /var")
	host, err := os.ReadFile(filepath.Join(pkgdb, "status"))
	require.NoError(t, err)
	assert.Equal(t, "Package: base\n", string(host), "the host's database is never written")
	upper, err := os.ReadFile(filepath.Join(disk, "upper", packageDBTarget, "status"))
	require.NoError(t, err)
	assert.Contains(t, string(upper), "coworkdeb", "the change is on the disk")
	for _, lock := range packageDBLocks {
		assert.FileExists(t, filepath.Join(disk, "upper", packageDBTarget, lock), "dpkg's locks made in the upper layer")
	}
	for _, d := range varSkeleton {
		assert.DirExists(t, filepath.Join(disk, "var", d.dir))
	}
}

// TestWriteAptSandboxConf: the setting is written where apt reads it, once
// (a file already there is left as it is), never through a symlink, and
// nothing is written where there is no apt; a disk whose upper layer has
// the name already (written before, or a session's whiteout) is not
// walked at all.
func TestWriteAptSandboxConf(t *testing.T) {
	outside, disk := t.TempDir(), t.TempDir()
	var errs struct{ none, first, again, link, upper error }
	var got, user []byte
	inMountNamespace(t, func() {
		if errs.none = unix.Mount("tmpfs", "/etc", "tmpfs", 0, ""); errs.none != nil {
			return
		}
		errs.none = writeAptSandboxConf(disk)
		_ = os.MkdirAll("/etc/apt/apt.conf.d", 0o755)
		errs.first = writeAptSandboxConf(disk)
		got, _ = os.ReadFile(aptSandboxConf)
		_ = os.WriteFile(aptSandboxConf, []byte("// the user's\n"), 0o644)
		errs.again = writeAptSandboxConf(disk)
		user, _ = os.ReadFile(aptSandboxConf)
		_ = os.RemoveAll("/etc/apt/apt.conf.d")
		_ = os.Symlink(outside, "/etc/apt/apt.conf.d")
		errs.link = writeAptSandboxConf(disk)
		inUpper := filepath.Join(disk, "upper", aptSandboxConf)
		_ = os.MkdirAll(filepath.Dir(inUpper), 0o755)
		_ = unix.Mknod(inUpper, unix.S_IFCHR, 0) // a whiteout: a session removed it
		errs.upper = writeAptSandboxConf(disk)
	})
	require.NoError(t, errs.none, "no /etc/apt: nothing to do")
	require.NoError(t, errs.first)
	assert.Equal(t, aptSandboxText, string(got))
	require.NoError(t, errs.again)
	assert.Equal(t, "// the user's\n", string(user), "a file there is left alone")
	assert.ErrorIs(t, errs.link, unix.ELOOP)
	assert.NoFileExists(t, filepath.Join(outside, filepath.Base(aptSandboxConf)))
	require.NoError(t, errs.upper, "the upper layer has it: /etc (a symlink here) is not walked")
}

// TestMakeSkeletonMendsOnlyWhatChanged: the skeleton gets back a mode a
// session changed, and leaves the directories that have theirs untouched
// (their inodes not written: same ctime) at the next start.
func TestMakeSkeletonMendsOnlyWhatChanged(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "tmp"), 0o700))
	require.NoError(t, os.Chmod(filepath.Join(dir, "tmp"), 0o700))
	fd, err := openRoot(dir)
	require.NoError(t, err)
	defer unix.Close(fd)

	require.NoError(t, makeSkeleton(fd))
	ctimes := make(map[string]unix.Timespec)
	for _, d := range varSkeleton {
		var st unix.Stat_t
		require.NoError(t, unix.Stat(filepath.Join(dir, d.dir), &st), d.dir)
		assert.Equal(t, d.mode, st.Mode&0o7777, "/var/%s's mode", d.dir)
		ctimes[d.dir] = st.Ctim
	}
	time.Sleep(10 * time.Millisecond) // past a coarse file-system clock's tick
	require.NoError(t, os.Chmod(filepath.Join(dir, "tmp"), 0o755))
	require.NoError(t, makeSkeleton(fd))
	for _, d := range varSkeleton {
		var st unix.Stat_t
		require.NoError(t, unix.Stat(filepath.Join(dir, d.dir), &st), d.dir)
		assert.Equal(t, d.mode, st.Mode&0o7777, "/var/%s's mode at the next start", d.dir)
		if d.dir != "tmp" {
			assert.Equal(t, ctimes[d.dir], st.Ctim, "/var/%s was written again", d.dir)
		}
	}
}
