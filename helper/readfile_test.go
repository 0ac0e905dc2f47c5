package helper

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Issue #18: readFile failed while the guest was down although the file
// was on the host.

func (e *testEnv) readFile(session, path string) (string, error) {
	e.t.Helper()
	var r struct{ Content string }
	if err := e.call("readFile", map[string]any{"processName": session, "filePath": path}, &r); err != nil {
		return "", err
	}
	b, err := base64.StdEncoding.DecodeString(r.Content)
	require.NoError(e.t, err)
	return string(b), nil
}

func TestReadFileFromTheHostWhileTheGuestIsDown(t *testing.T) {
	e := newTestEnv(t)
	home := filepath.Join(e.s.sessionsDir, "s")
	require.NoError(t, os.MkdirAll(filepath.Join(home, "out"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, "out", "a.txt"), []byte("hello"), 0o600))

	got, err := e.readFile("s", "/sessions/s/out/a.txt")
	require.NoError(t, err, "no guest at all")
	assert.Equal(t, "hello", got)
	got, err = e.readFile("s", "out/a.txt")
	require.NoError(t, err)
	assert.Equal(t, "hello", got, "a relative path is taken in the session's home")

	// What the host directory cannot answer for is refused.
	outside := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(outside, []byte("secret"), 0o600))
	require.NoError(t, os.Symlink(outside, filepath.Join(home, "link")))
	require.NoError(t, os.Symlink(filepath.Dir(outside), filepath.Join(home, "dirlink")))
	writeFile(t, filepath.Join(home, "mnt", "work", "shadowed"), 3) // a mount point's underside
	writeFile(t, filepath.Join(home, "big"), protocol.MaxReadFileBytes+1)
	require.NoError(t, unix.Mkfifo(filepath.Join(home, "fifo"), 0o600))
	for path, why := range map[string]string{
		"/sessions/s/link":              "too many levels of symbolic links",
		"/sessions/s/dirlink/secret":    "too many levels of symbolic links",
		"/sessions/s/mnt/work/shadowed": "mounts",
		"/sessions/s/mnt":               "mounts",
		"/sessions/s/big":               "larger than",
		"/sessions/s/fifo":              "not a regular file",
		"/sessions/s/out":               "not a regular file",
		"/sessions/s/missing":           "no such file",
		"/etc/passwd":                   "outside session",
		"/sessions/s/../t/a":            "outside session",
	} {
		_, err := e.readFile("s", path)
		require.Error(t, err, path)
		assert.Contains(t, err.Error(), why, path)
		assert.NotContains(t, err.Error(), e.s.sessionsDir, "%s: the error names the guest path, not the host's", path)
	}

	// A mount a guest made below the home (not under mnt/) is refused
	// too once the guest is down: the host directory beneath it is not
	// what the guest saw there.
	e.start()
	writeFile(t, filepath.Join(home, "inner", "x"), 3)
	require.NoError(t, e.s.AddGuestMount(t.TempDir(), "/sessions/s/inner", false))
	e.mustCall("stopVM", nil, nil)
	_, err = e.readFile("s", "/sessions/s/inner/x")
	require.ErrorContains(t, err, "inside the mount /sessions/s/inner")
	got, err = e.readFile("s", "/sessions/s/out/a.txt")
	require.NoError(t, err)
	assert.Equal(t, "hello", got)
}

// While the guest is connected and has the session, readFile reads in the
// guest (where the session's mounts are), not on the host; a session not
// spawned in this guest yet is read from the host.
func TestReadFileGoesToTheGuestWhenItHasTheSession(t *testing.T) {
	e := newTestEnv(t)
	g := e.start()
	require.NoError(t, os.MkdirAll(filepath.Join(e.s.sessionsDir, "s"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(e.s.sessionsDir, "s", "f"), []byte("from the host"), 0o600))
	g.agent.mu.Lock()
	g.agent.files["/sessions/s/f"] = []byte("from the guest")
	g.agent.mu.Unlock()
	got, err := e.readFile("s", "/sessions/s/f")
	require.NoError(t, err)
	assert.Equal(t, "from the host", got, "the guest has not mounted the session")
	e.spawn(map[string]any{"id": "p", "name": "s", "command": "sh"})
	got, err = e.readFile("s", "/sessions/s/f")
	require.NoError(t, err)
	assert.Equal(t, "from the guest", got)
}
