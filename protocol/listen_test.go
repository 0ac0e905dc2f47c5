package protocol

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestListenCreatesPrivateParentAndSocket0600(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "a", "b", "h.sock")
	l, err := Listen(path, discardLogger())
	require.NoError(t, err)
	defer l.Close()

	st, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	st, err = os.Lstat(path)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSocket, st.Mode().Type())
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Equal(t, path, l.Path())

	require.NoError(t, l.Close())
	_, err = os.Lstat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "Close removes the socket")
	assert.NoError(t, l.Close(), "Close is idempotent")
}

func TestListenRefusesNonPrivateParent(t *testing.T) {
	for _, mode := range []os.FileMode{0o755, 0o750, 0o770, 0o757, 0o777, 0o701} {
		dir := filepath.Join(shortTempDir(t), "run")
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, os.Chmod(dir, mode))
		_, err := Listen(filepath.Join(dir, "h.sock"), discardLogger())
		require.ErrorIs(t, err, ErrUnsafeSocketDir, "mode %o", mode)
		assert.Contains(t, err.Error(), dir)
		assert.Contains(t, err.Error(), "chmod 0700")
		_, statErr := os.Lstat(filepath.Join(dir, "h.sock"))
		assert.ErrorIs(t, statErr, os.ErrNotExist, "nothing bound")
	}
}

func TestListenRefusesParentOwnedByAnotherUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to chown a directory to another uid")
	}
	dir := filepath.Join(shortTempDir(t), "run")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chown(dir, 4242, 4242))
	_, err := Listen(filepath.Join(dir, "h.sock"), discardLogger())
	require.ErrorIs(t, err, ErrUnsafeSocketDir)
	assert.Contains(t, err.Error(), "owned by uid 4242")
}

func TestListenRefusesParentThatIsAFile(t *testing.T) {
	f := filepath.Join(shortTempDir(t), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o600))
	_, err := Listen(filepath.Join(f, "h.sock"), discardLogger())
	assert.ErrorIs(t, err, ErrUnsafeSocketDir)
}

func TestListenRefusesSymlinkAtPath(t *testing.T) {
	dir := shortTempDir(t)
	target := filepath.Join(dir, "target.sock")
	// A stale socket as the target: following the link would remove it.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: target, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	path := filepath.Join(dir, "h.sock")
	require.NoError(t, os.Symlink(target, path))

	_, err = Listen(path, discardLogger())
	require.ErrorIs(t, err, ErrSocketPathInUse)
	assert.Contains(t, err.Error(), "symlink")
	_, err = os.Lstat(target)
	assert.NoError(t, err, "the link's target is untouched")
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	assert.Equal(t, os.ModeSymlink, fi.Mode().Type(), "the link is left in place")
}

func TestListenRemovesStaleSocket(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "h.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	_, err = os.Lstat(path)
	require.NoError(t, err, "stale socket file left behind")

	l, err := Listen(path, discardLogger())
	require.NoError(t, err)
	defer l.Close()
	c, err := net.Dial("unix", path)
	require.NoError(t, err, "the new socket answers")
	_ = c.Close()
}

func TestListenRefusesLiveSocket(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "h.sock")
	first, err := Listen(path, discardLogger())
	require.NoError(t, err)
	defer first.Close()

	_, err = Listen(path, discardLogger())
	require.ErrorIs(t, err, ErrSocketPathInUse)
	assert.Contains(t, err.Error(), "already running")
	c, err := net.Dial("unix", path)
	require.NoError(t, err, "the first server's socket is intact")
	_ = c.Close()
}

func TestListenRefusesRegularFile(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "h.sock")
	require.NoError(t, os.WriteFile(path, []byte("precious"), 0o600))
	_, err := Listen(path, discardLogger())
	require.ErrorIs(t, err, ErrSocketPathInUse)
	assert.Contains(t, err.Error(), "not a socket")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "precious", string(b))
}

func TestCloseLeavesAReplacedPathAlone(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "h.sock")
	l, err := Listen(path, discardLogger())
	require.NoError(t, err)
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.WriteFile(path, []byte("someone else's"), 0o600))
	require.NoError(t, l.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "someone else's", string(b))
}

func TestPeerUIDCheck(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "h.sock")
	l, err := Listen(path, discardLogger())
	require.NoError(t, err)
	defer l.Close()

	client, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer client.Close()
	server, err := l.Accept()
	require.NoError(t, err, "a same-uid peer is accepted")
	defer server.Close()

	uc := server.(*net.UnixConn)
	uid, err := PeerUID(uc)
	require.NoError(t, err)
	assert.Equal(t, uint32(os.Getuid()), uid)
	assert.NoError(t, CheckPeerUID(uc, os.Getuid()))
	err = CheckPeerUID(uc, os.Getuid()+1)
	assert.ErrorIs(t, err, ErrPeerUID, "a peer of another uid is refused")

	assert.NoError(t, checkUID(1000, 1000))
	assert.ErrorIs(t, checkUID(0, 1000), ErrPeerUID)
	assert.ErrorIs(t, checkUID(1000, -1), ErrPeerUID)
}

func TestAcceptDropsForeignPeers(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "h.sock")
	logs := &lockedBuffer{}
	l, err := Listen(path, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	defer l.Close()
	l.uid = os.Getuid() + 1 // pretend we run as someone else: every peer is foreign

	client, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer client.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	_, err = ReadFrame(client)
	assert.ErrorIs(t, err, io.EOF, "the foreign peer is disconnected")
	require.NoError(t, l.Close())
	_, ok := <-accepted
	assert.False(t, ok, "Accept never returned the foreign peer")
	assert.Contains(t, logs.String(), "rejected client connection")
}
