package helper

import (
	"path"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestValidateSessionName(t *testing.T) {
	for _, ok := range []string{"local_3f2a", "happy-dolphin", "a.b", ".hidden"} {
		assert.NoError(t, validateSessionName(ok), ok)
	}
	for _, bad := range []string{"", ".", "..", "../x", "a/b", "/abs", "x..y", "nul\x00", string(make([]byte, 256))} {
		assert.Error(t, validateSessionName(bad), "%q", bad)
	}
}

func TestCleanMountName(t *testing.T) {
	for in, want := range map[string]string{"work": "work", ".claude/skills": ".claude/skills", "a//b/": "a/b", "./a": "a"} {
		got, err := cleanMountName(in)
		assert.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", ".", "/abs", "..", "a/../b", "a/..", "../a", "nul\x00"} {
		_, err := cleanMountName(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestHostPathFromClient(t *testing.T) {
	got, err := hostPathFromClient("home/u/work")
	assert.NoError(t, err)
	assert.Equal(t, "/home/u/work", got)
	got, err = hostPathFromClient("/home/u/../v")
	assert.NoError(t, err)
	assert.Equal(t, "/home/v", got)
	for _, bad := range []string{"", "/", "//", "a\x00"} {
		_, err := hostPathFromClient(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestMountMode(t *testing.T) {
	for mode, ro := range map[string]bool{"": false, "rw": false, "rwd": false, "ro": true} {
		got, err := mountMode(mode)
		assert.NoError(t, err)
		assert.Equal(t, ro, got, mode)
	}
	_, err := mountMode("RW")
	assert.Error(t, err)
}

func FuzzCleanMountName(f *testing.F) {
	for _, s := range []string{"work", ".claude/skills", "../x", "a/../b", "/abs", "a//b/", ".", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := cleanMountName(name)
		if err != nil {
			return
		}
		if clean == "" || clean == "." || strings.HasPrefix(clean, "/") || path.Clean(clean) != clean {
			t.Fatalf("cleanMountName(%q) = %q: not a clean relative path", name, clean)
		}
		for _, c := range strings.Split(clean, "/") {
			if c == ".." {
				t.Fatalf("cleanMountName(%q) = %q has a .. component", name, clean)
			}
		}
		target := path.Join("/sessions/s/mnt", clean)
		if !strings.HasPrefix(target, "/sessions/s/mnt/") {
			t.Fatalf("mount %q escapes to %q", name, target)
		}
	})
}

func FuzzConfineToSession(f *testing.F) {
	for _, s := range [][2]string{{"s", "/sessions/s/a"}, {"s", "/sessions/s/../t"}, {"s", "/sessions/s"}, {"..", "/x"}, {"s", "//sessions//s//a/."}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, name, p string) {
		if validateSessionName(name) != nil {
			return
		}
		got, err := confineToSession(name, p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/sessions/"+name+"/") || path.Clean(got) != got {
			t.Fatalf("confineToSession(%q, %q) = %q escapes the session", name, p, got)
		}
	})
}
