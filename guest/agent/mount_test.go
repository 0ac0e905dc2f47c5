package agent

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	f.Fuzz(func(t *testing.T, raw []byte) {
		var p protocol.MountParams
		if decodeParams(raw, &p) != nil {
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
		if mt.Source.Kind == "9p" && (strings.ContainsAny(mt.Source.Tag+mt.Source.Aname, ",\x00") || strings.ContainsRune(mt.Source.Aname, '/') || mt.Source.Aname == "..") {
			t.Fatalf("accepted 9p option injection %+v", mt.Source)
		}
		if c := mt.Source.Cache; c != "" && (mt.Source.Kind != "9p" || c != protocol.NinePCacheLoose) {
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
	root, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m.ninePRoots[tag] = ninePMount{root: root, cache: cache}
	t.Cleanup(m.close)
	return m, root
}

func TestNinePTagKeepsItsCacheMode(t *testing.T) {
	m, root := mounterWithTag(t, "cowork-sys", protocol.NinePCacheLoose)
	m.mu.Lock()
	got, err := m.ninePRoot("cowork-sys", protocol.NinePCacheLoose)
	m.mu.Unlock()
	if err != nil || got != root {
		t.Fatalf("same tag, same cache mode: %v, %v; want the mounted root again", got, err)
	}
	m.mu.Lock()
	_, err = m.ninePRoot("cowork-sys", protocol.NinePCacheNone)
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
	err := m.setup(protocol.SetupParams{System: mixed})
	if err == nil || !strings.Contains(err.Error(), "/etc") || !strings.Contains(err.Error(), "cache mode") {
		t.Fatalf("setup error %v, want the /etc mount's cache mode conflict", err)
	}
	if m.setupRan || len(m.mounts) != 0 || len(m.ninePRoots) != 0 {
		t.Errorf("a refused setup left state: ran %v, mounts %v, 9p devices %v", m.setupRan, m.mounts, m.ninePRoots)
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
	assert.Equal(t, "mounted\ninner\n", c.waitExit("before").stdout.String())

	// Through a symlink (a guest could swap a session's directory for one).
	require.NoError(t, os.Symlink(filepath.Join(base, "s"), filepath.Join(base, "link")))
	err := c.call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: filepath.Join(base, "link", "mnt", "x")}, nil)
	assert.ErrorContains(t, err, "nothing the agent mounted")

	require.NoError(t, c.call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: target}, nil))
	c.spawn("after", "sh", "-c", "ls -A "+target+"; echo end")
	assert.Equal(t, "end\n", c.waitExit("after").stdout.String(), "the mount and the one below it are gone")
	err = c.call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: filepath.Join(target, "in")}, nil)
	assert.ErrorContains(t, err, "nothing the agent mounted", "forgotten with its parent")
	err = c.call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: base}, nil)
	assert.ErrorContains(t, err, "nothing the agent mounted")
	err = c.call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: "relative"}, nil)
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
	err := c.call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: target}, nil)
	assert.ErrorContains(t, err, "too many levels of symbolic links")
	require.NoError(t, os.WriteFile(filepath.Join(src, "f"), nil, 0o644))
	c.spawn("check", "ls", victim)
	assert.Equal(t, "f\n", c.waitExit("check").stdout.String(), "the other mount is untouched")
}
