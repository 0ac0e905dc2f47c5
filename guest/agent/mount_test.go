package agent

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// FuzzMountParams feeds arbitrary mount request params through decoding and
// validation: never a panic, and whatever is accepted is a clean absolute
// target outside the agent's reserved paths, with a safe source.
func FuzzMountParams(f *testing.F) {
	f.Add([]byte(`{"mount":{"source":{"kind":"bind","path":"/home/u/p"},"target":"/sessions/s/mnt/p","readOnly":true}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"9p","tag":"cowork","aname":"s1-home"},"target":"/sessions/s1"}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"bind","path":"/sdk/1.0"},"sourceFile":"claude","target":"/usr/local/bin/claude"}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"tmpfs"},"target":"/.host/x"}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"9p","tag":"cowork-sys","aname":"e1","cache":"loose"},"target":"/usr","readOnly":true}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"9p","tag":"cowork","aname":"e2","cache":"loose,rw"},"target":"/opt"}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"virtiofs","tag":"cowork","aname":"e3"},"target":"/sessions/s1"}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"virtiofs","tag":"cowork","aname":"e4"},"sourceFile":".gitconfig","target":"/sessions/s1/.gitconfig"}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"virtiofs","tag":"cowork-sys","aname":"../e1","cache":"loose"},"target":"/usr"}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var p protocol.MountParams
		if json.Unmarshal(raw, &p) != nil {
			return
		}
		mt := p.Mount
		if validateMount(mt) != nil {
			return
		}
		if !filepath.IsAbs(mt.Target) || filepath.Clean(mt.Target) != mt.Target || mt.Target == "/" {
			t.Fatalf("accepted target %q", mt.Target)
		}
		for _, reserved := range []string{hostRootDir, stagingDir} {
			if mt.Target == reserved || strings.HasPrefix(mt.Target, reserved+"/") {
				t.Fatalf("accepted reserved target %q", mt.Target)
			}
		}
		if strings.Contains(mt.SourceFile, "..") && strings.Split(mt.SourceFile, "/")[0] == ".." {
			t.Fatalf("accepted escaping sourceFile %q", mt.SourceFile)
		}
		if k := mt.Source.Kind; (k == "9p" || k == "virtiofs") && (mt.Source.Tag == "" || strings.ContainsAny(mt.Source.Tag+mt.Source.Aname, ",\x00") ||
			strings.ContainsRune(mt.Source.Aname, '/') || mt.Source.Aname == ".." || mt.Source.Aname == "." || mt.Source.Aname == "") {
			t.Fatalf("accepted %s option injection or escape %+v", k, mt.Source)
		}
		if c := mt.Source.Cache; c != "" && mt.Source.Kind != "virtiofs" && (mt.Source.Kind != "9p" || c != protocol.NinePCacheLoose) {
			t.Fatalf("accepted cache mode %q on a %s source", c, mt.Source.Kind)
		}
		if _, err := json.Marshal(mt); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNinePMountOptionsPerCacheMode(t *testing.T) {
	none := ninePMountOptions(protocol.NinePCacheNone)
	if none != ninePOptions || strings.Contains(none, "cache=") {
		t.Errorf("cache none: options %q, want %q (no cache option: Linux's default, cache=none)", none, ninePOptions)
	}
	loose := ninePMountOptions(protocol.NinePCacheLoose)
	if loose != ninePOptions+",cache=loose" {
		t.Errorf("cache loose: options %q, want %q", loose, ninePOptions+",cache=loose")
	}
}

func TestValidateMountCacheModes(t *testing.T) {
	nineP := func(cache string) protocol.Mount {
		return protocol.Mount{Source: protocol.MountSource{Kind: "9p", Tag: "cowork-sys", Aname: "e1", Cache: cache}, Target: "/usr", ReadOnly: true}
	}
	for _, cache := range []string{protocol.NinePCacheNone, protocol.NinePCacheLoose} {
		if err := validateMount(nineP(cache)); err != nil {
			t.Errorf("9p cache %q refused: %v", cache, err)
		}
	}
	for _, cache := range []string{"none", "mmap", "fscache", "Loose", "loose,rw", "loose\x00", "readahead"} {
		err := validateMount(nineP(cache))
		if err == nil || !strings.Contains(err.Error(), "cache mode") {
			t.Errorf("9p cache %q: error %v, want a refused cache mode", cache, err)
		}
	}
	for _, src := range []protocol.MountSource{
		{Kind: "bind", Path: "/usr", Cache: protocol.NinePCacheLoose},
		{Kind: "tmpfs", Cache: protocol.NinePCacheLoose},
	} {
		err := validateMount(protocol.Mount{Source: src, Target: "/usr"})
		if err == nil || !strings.Contains(err.Error(), "cache mode") {
			t.Errorf("%s source with a cache mode: error %v, want it refused", src.Kind, err)
		}
	}
}

// mounterWithTag returns a mounter that has the 9p device tag mounted in
// cache mode cache (a directory stands in for the device's attach root).
func mounterWithTag(t *testing.T, tag, cache string) (*mounter, *os.File) {
	t.Helper()
	m := newMounter(slog.New(slog.DiscardHandler), false)
	t.Cleanup(m.close)
	return m, withDevice(t, m, protocol.MountKindNineP, tag, cache, t.TempDir())
}

// withDevice records the device of this kind and tag as mounted in m, in
// cache mode cache, with the directory dir standing in for its root.
func withDevice(t *testing.T, m *mounter, kind, tag, cache, dir string) *os.File {
	t.Helper()
	root, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.devices[deviceKey{kind, tag}] = deviceMount{root: root, cache: cache}
	return root
}

func TestNinePTagKeepsItsCacheMode(t *testing.T) {
	m, root := mounterWithTag(t, "cowork-sys", protocol.NinePCacheLoose)
	src := protocol.MountSource{Kind: protocol.MountKindNineP, Tag: "cowork-sys", Cache: protocol.NinePCacheLoose}
	m.mu.Lock()
	got, err := m.deviceRoot(src)
	m.mu.Unlock()
	if err != nil || got != root {
		t.Fatalf("same tag, same cache mode: %v, %v; want the mounted root again", got, err)
	}
	src.Cache = protocol.NinePCacheNone
	m.mu.Lock()
	_, err = m.deviceRoot(src)
	m.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), `"cowork-sys" is mounted with cache mode loose`) ||
		!strings.Contains(err.Error(), "cache mode none") {
		t.Fatalf("same tag, other cache mode: error %v, want a cache mode conflict naming both modes", err)
	}
}

func TestMountRefusesAConflictingCacheModeBeforeTouchingTheTarget(t *testing.T) {
	m, _ := mounterWithTag(t, "cowork", protocol.NinePCacheNone)
	target := filepath.Join(t.TempDir(), "home")
	prev := protocol.Mount{Source: protocol.MountSource{Kind: "9p", Tag: "cowork", Aname: "e1"}, Target: target}
	m.mounts[target] = prev
	next := prev
	next.Source.Cache = protocol.NinePCacheLoose
	err := m.mount(next)
	if err == nil || !strings.Contains(err.Error(), "cache mode") {
		t.Fatalf("mount error %v, want a cache mode conflict", err)
	}
	if got := m.mounts[target]; got != prev {
		t.Errorf("the mount at %s became %+v; a refused replacement must leave %+v", target, got, prev)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("the refused mount created its target (stat: %v)", err)
	}
}

func TestSetupRefusesMixedCacheModesOnOneTag(t *testing.T) {
	m := newMounter(slog.New(slog.DiscardHandler), false)
	defer m.close()
	sys := func(target, tag, cache string) protocol.Mount {
		return protocol.Mount{Source: protocol.MountSource{Kind: "9p", Tag: tag, Aname: "e" + filepath.Base(target), Cache: cache}, Target: target, ReadOnly: true}
	}
	mixed := []protocol.Mount{sys("/usr", "cowork-sys", protocol.NinePCacheLoose), sys("/etc", "cowork-sys", protocol.NinePCacheNone)}
	err := m.setup(protocol.SetupParams{System: mixed}, nil)
	if err == nil || !strings.Contains(err.Error(), "/etc") || !strings.Contains(err.Error(), "cache mode") {
		t.Fatalf("setup error %v, want the /etc mount's cache mode conflict", err)
	}
	if m.setupRan || len(m.mounts) != 0 || len(m.devices) != 0 {
		t.Errorf("a refused setup left state: ran %v, mounts %v, devices %v", m.setupRan, m.mounts, m.devices)
	}
	// Different tags may use different modes.
	if err := m.checkNinePCaches(sys("/usr", "cowork-sys", protocol.NinePCacheLoose), sys("/sessions/s", "cowork", protocol.NinePCacheNone)); err != nil {
		t.Errorf("two tags in two cache modes refused: %v", err)
	}
}

// TestChildAgentUnmount: unmount removes what the agent mounted (and what
// it mounted below it), refuses what it did not mount and a path through a
// symlink, and forgets a target already gone.
func TestChildAgentUnmount(t *testing.T) {
	c := startChildAgent(t, nil)
	src, inner, base := t.TempDir(), t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(src, "f"), []byte("mounted\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(inner, "g"), []byte("inner\n"), 0o644))
	target := filepath.Join(base, "s", "mnt", "x")
	c.bind(src, target, false)
	c.bind(inner, filepath.Join(target, "in"), true)
	c.spawn("before", "cat", filepath.Join(target, "f"), filepath.Join(target, "in", "g"))
	assert.Equal(t, "mounted\ninner\n", c.WaitExit("before").Stdout.String())

	// Through a symlink (a guest could swap a session's directory for one).
	require.NoError(t, os.Symlink(filepath.Join(base, "s"), filepath.Join(base, "link")))
	err := c.Call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: filepath.Join(base, "link", "mnt", "x")}, nil)
	assert.ErrorContains(t, err, "nothing the agent mounted")

	require.NoError(t, c.Call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: target}, nil))
	c.spawn("after", "sh", "-c", "ls -A "+target+"; echo end")
	assert.Equal(t, "end\n", c.WaitExit("after").Stdout.String(), "the mount and the one below it are gone")
	err = c.Call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: filepath.Join(target, "in")}, nil)
	assert.ErrorContains(t, err, "nothing the agent mounted", "forgotten with its parent")
	err = c.Call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: base}, nil)
	assert.ErrorContains(t, err, "nothing the agent mounted")
	err = c.Call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: "relative"}, nil)
	assert.ErrorContains(t, err, "not an absolute path")
}

// TestChildAgentUnmountRefusesASwappedPath: a target whose directory was
// swapped for a symlink since the mount is not unmounted through it.
func TestChildAgentUnmountRefusesASwappedPath(t *testing.T) {
	c := startChildAgent(t, nil)
	src, base := t.TempDir(), t.TempDir()
	victim := filepath.Join(base, "other", "mnt", "x")
	c.bind(src, victim, false)
	target := filepath.Join(base, "own", "mnt", "x")
	c.bind(src, target, false)
	// What a guest process can do to its own session: move its mnt away
	// and point the name at another session's.
	require.NoError(t, os.Rename(filepath.Join(base, "own", "mnt"), filepath.Join(base, "own", "moved")))
	require.NoError(t, os.Symlink(filepath.Join(base, "other", "mnt"), filepath.Join(base, "own", "mnt")))
	err := c.Call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: target}, nil)
	assert.ErrorContains(t, err, "too many levels of symbolic links")
	require.NoError(t, os.WriteFile(filepath.Join(src, "f"), nil, 0o644))
	c.spawn("check", "ls", victim)
	assert.Equal(t, "f\n", c.WaitExit("check").Stdout.String(), "the other mount is untouched")
}

func TestDeviceKindsMountArguments(t *testing.T) {
	vfs := deviceKinds[protocol.MountKindVirtioFS]
	if vfs.fstype != "virtiofs" || vfs.cacheModes {
		t.Errorf("virtiofs: %+v, want fstype virtiofs without cache modes", vfs)
	}
	for _, cache := range []string{protocol.NinePCacheNone, protocol.NinePCacheLoose} {
		src := protocol.MountSource{Kind: protocol.MountKindVirtioFS, Tag: "cowork", Aname: "e1", Cache: cache}
		if got := vfs.options(vfs.cache(src)); got != "" {
			t.Errorf("virtiofs source with cache %q: mount options %q, want none (the tag is the source)", cache, got)
		}
	}
	nineP := deviceKinds[protocol.MountKindNineP]
	src := protocol.MountSource{Kind: protocol.MountKindNineP, Tag: "cowork-sys", Aname: "e1", Cache: protocol.NinePCacheLoose}
	if nineP.fstype != "9p" || nineP.options(nineP.cache(src)) != ninePMountOptions(protocol.NinePCacheLoose) {
		t.Errorf("9p: fstype %q, options %q", nineP.fstype, nineP.options(nineP.cache(src)))
	}
}

func TestValidateMountVirtioFS(t *testing.T) {
	vfs := func(tag, aname string) protocol.Mount {
		return protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindVirtioFS, Tag: tag, Aname: aname}, Target: "/sessions/s"}
	}
	ok := []protocol.Mount{vfs("cowork", "e1"), vfs("cowork-sys", "e12")}
	file := vfs("cowork", "e2")
	file.SourceFile = ".gitconfig"
	cached := vfs("cowork-sys", "e3")
	cached.Source.Cache = protocol.NinePCacheLoose // ignored: the host device decides
	ok = append(ok, file, cached)
	for _, mt := range ok {
		if err := validateMount(mt); err != nil {
			t.Errorf("%+v refused: %v", mt, err)
		}
	}
	for _, mt := range []protocol.Mount{
		vfs("", "e1"), vfs("cowork", ""), vfs("cowork", "."), vfs("cowork", ".."), vfs("cowork", "e1/x"),
		vfs("cowork", "e1,dax"), vfs("cow,ork", "e1"), vfs("cowork\x00", "e1"),
	} {
		err := validateMount(mt)
		if err == nil || !strings.Contains(err.Error(), "virtio-fs") {
			t.Errorf("%+v: error %v, want a refused virtio-fs source", mt.Source, err)
		}
	}
}

// A virtio-fs device and a 9p device of the same tag are two devices; a
// virtio-fs device has no cache mode to conflict; an export is opened
// beneath its own device's root, no symlink followed.
func TestDeviceExportsResolveBeneathTheirOwnDevice(t *testing.T) {
	m := newMounter(slog.New(slog.DiscardHandler), false)
	t.Cleanup(m.close)
	vfsDir, ninePDir := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(vfsDir, "e1"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(vfsDir, "e1", "f"), []byte("vfs"), 0o644))
	require.NoError(t, os.Symlink("/etc", filepath.Join(vfsDir, "e1", "link")))
	require.NoError(t, os.Symlink("/etc", filepath.Join(vfsDir, "e2")))
	require.NoError(t, os.MkdirAll(filepath.Join(ninePDir, "e1"), 0o755))
	withDevice(t, m, protocol.MountKindVirtioFS, "cowork", "", vfsDir)
	withDevice(t, m, protocol.MountKindNineP, "cowork", protocol.NinePCacheNone, ninePDir)

	open := func(src protocol.MountSource, rel string) (unix.Stat_t, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		var st unix.Stat_t
		fd, err := m.deviceExport(src, rel)
		if err != nil {
			return st, err
		}
		defer unix.Close(fd)
		return st, unix.Fstat(fd, &st)
	}
	inode := func(p string) uint64 {
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(p, &st))
		return st.Ino
	}
	vfs := protocol.MountSource{Kind: protocol.MountKindVirtioFS, Tag: "cowork", Aname: "e1", Cache: protocol.NinePCacheLoose}
	st, err := open(vfs, "")
	require.NoError(t, err, "a virtio-fs source's cache mode is ignored, never a conflict")
	assert.Equal(t, inode(filepath.Join(vfsDir, "e1")), st.Ino)
	st, err = open(vfs, "f")
	require.NoError(t, err)
	assert.Equal(t, inode(filepath.Join(vfsDir, "e1", "f")), st.Ino)
	st, err = open(protocol.MountSource{Kind: protocol.MountKindNineP, Tag: "cowork", Aname: "e1"}, "")
	require.NoError(t, err)
	assert.Equal(t, inode(filepath.Join(ninePDir, "e1")), st.Ino, "the 9p device of the same tag is another device")

	_, err = open(vfs, "link")
	assert.ErrorIs(t, err, unix.ELOOP)
	assert.ErrorContains(t, err, "virtio-fs export cowork:e1/link")
	_, err = open(protocol.MountSource{Kind: protocol.MountKindVirtioFS, Tag: "cowork", Aname: "e2"}, "")
	assert.ErrorIs(t, err, unix.ELOOP, "an export that is a symlink is not followed")

	// 9p cache modes are checked per 9p tag only.
	sys := func(kind, cache string) protocol.Mount {
		return protocol.Mount{Source: protocol.MountSource{Kind: kind, Tag: "cowork", Aname: "e1", Cache: cache}, Target: "/usr"}
	}
	m.mu.Lock()
	err = m.checkNinePCaches(sys(protocol.MountKindVirtioFS, protocol.NinePCacheLoose), sys(protocol.MountKindVirtioFS, ""))
	m.mu.Unlock()
	assert.NoError(t, err)
}

// inMountNamespace runs fn on a thread of its own in a new mount namespace
// whose mounts are private (nothing fn mounts reaches the host's), or
// skips the test where that cannot be made.
func inMountNamespace(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine, and its
		// namespace with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			done <- err
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			done <- err
			return
		}
		defer close(done)
		fn()
	}()
	if err, ok := <-done; ok {
		t.Skipf("cannot make a private mount namespace: %v", err)
	}
}

// TestMountFromAVirtioFSDevice: a virtio-fs source mounts its export (a
// directory, read-only as asked) and a single file out of an export, out
// of the device's root (a directory stands in for the mounted device).
func TestMountFromAVirtioFSDevice(t *testing.T) {
	dev, base := t.TempDir(), t.TempDir()
	for p, content := range map[string]string{"e1/f": "in e1\n", "e2/.gitconfig": "[user]\n"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dev, filepath.Dir(p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dev, p), []byte(content), 0o644))
	}
	require.NoError(t, os.Symlink(filepath.Join(base, "victim"), filepath.Join(dev, "e3")))
	home := filepath.Join(base, "s", "mnt", "work")
	file := filepath.Join(base, "s", ".gitconfig")
	var errs struct{ root, dir, file, write, link error }
	var got struct{ dir, file []byte }
	inMountNamespace(t, func() {
		m := newMounter(slog.New(slog.DiscardHandler), false)
		defer m.close()
		// The stand-in root is opened in this namespace (open_tree clones
		// only mounts of the caller's namespace).
		root, err := os.Open(dev)
		if errs.root = err; err != nil {
			return
		}
		m.devices[deviceKey{protocol.MountKindVirtioFS, "cowork"}] = deviceMount{root: root}
		src := func(aname string) protocol.MountSource {
			return protocol.MountSource{Kind: protocol.MountKindVirtioFS, Tag: "cowork", Aname: aname}
		}
		if errs.dir = m.mount(protocol.Mount{Source: src("e1"), Target: home, ReadOnly: true}); errs.dir == nil {
			got.dir, errs.dir = os.ReadFile(filepath.Join(home, "f"))
			errs.write = os.WriteFile(filepath.Join(home, "new"), nil, 0o644)
			defer unix.Unmount(home, unix.MNT_DETACH)
		}
		if errs.file = m.mount(protocol.Mount{Source: src("e2"), SourceFile: ".gitconfig", Target: file}); errs.file == nil {
			got.file, errs.file = os.ReadFile(file)
			defer unix.Unmount(file, unix.MNT_DETACH)
		}
		errs.link = m.mount(protocol.Mount{Source: src("e3"), Target: filepath.Join(base, "s", "mnt", "other")})
	})
	require.NoError(t, errs.root)
	require.NoError(t, errs.dir)
	assert.Equal(t, "in e1\n", string(got.dir))
	assert.ErrorIs(t, errs.write, unix.EROFS, "the bind is read-only")
	require.NoError(t, errs.file)
	assert.Equal(t, "[user]\n", string(got.file))
	assert.ErrorIs(t, errs.link, unix.ELOOP, "an export that is a symlink is refused")
	assert.NoDirExists(t, filepath.Join(base, "s", "mnt", "other"), "the refused mount made no target")
	assert.NoFileExists(t, filepath.Join(home, "f"), "the mount stayed in its namespace")
}
