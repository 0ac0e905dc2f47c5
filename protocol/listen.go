package protocol

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnsafeSocketDir is wrapped by Listen's error when the socket's parent
// directory is not private to our uid.
var ErrUnsafeSocketDir = errors.New("unsafe socket directory")

// ErrSocketPathInUse is wrapped by Listen's error when something other than
// a stale socket of ours sits at the socket path.
var ErrSocketPathInUse = errors.New("socket path in use")

// ErrPeerUID is wrapped by CheckPeerUID's error for a peer of another uid.
var ErrPeerUID = errors.New("peer runs as another uid")

// staleProbeTimeout bounds the connect used to tell a live socket from a
// stale one.
const staleProbeTimeout = time.Second

// SocketListener is the listener Listen returns: a Unix listener whose
// Accept drops peers of another uid (SO_PEERCRED) with a log line, and whose
// Close removes the socket file (only if it is still the one we created).
type SocketListener struct {
	ln   *net.UnixListener
	path string
	log  *slog.Logger
	uid  int
	dev  uint64
	ino  uint64

	closeOnce sync.Once
	closeErr  error
}

// Listen binds the client socket at path safely:
//   - the parent directory is created 0700 when missing; an existing parent
//     with any group/other permission bit (the client only connects through
//     a 0700 directory) or owned by another uid is refused with an error
//     naming it, its mode and owner, and the fix;
//   - a symlink at path is never followed (refused);
//   - an existing socket at path is removed only if stale (nothing accepts
//     a connection on it); a live socket or any other file is refused;
//   - the socket file is made 0600.
//
// logger receives one line per rejected peer; nil = slog.Default().
func Listen(path string, logger *slog.Logger) (*SocketListener, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if path == "" {
		return nil, errors.New("protocol: empty socket path")
	}
	path = filepath.Clean(path)
	uid := os.Getuid()
	if err := ensurePrivateDir(filepath.Dir(path), uid); err != nil {
		return nil, err
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}

	// Bind and listen under a temporary name in the same directory, make it
	// 0600, then rename it into place: the socket appears at path only once
	// it accepts connections with its final mode. (Between bind and listen a
	// connect would get ECONNREFUSED, which the desktop client takes as a
	// dead helper and answers by respawning it.) rename replaces, never
	// follows, whatever a racing process may have put at path.
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d.tmp", filepath.Base(path), os.Getpid()))
	_ = os.Remove(tmp) // a leftover of a crashed earlier run with our pid
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("protocol: bind %s: %w", path, err)
	}
	// We remove the file ourselves (only if it is still ours).
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		_ = ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("protocol: chmod 0600 %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("protocol: move socket into place at %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("protocol: stat new socket %s: %w", path, err)
	}
	return &SocketListener{ln: ln, path: path, log: logger, uid: uid, dev: uint64(st.Dev), ino: st.Ino}, nil
}

// Path is the socket's path.
func (l *SocketListener) Path() string { return l.path }

// Addr implements net.Listener.
func (l *SocketListener) Addr() net.Addr { return l.ln.Addr() }

// Accept implements net.Listener: it returns the next connection from a peer
// with our uid, closing (and logging) any other.
func (l *SocketListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.ln.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if err := CheckPeerUID(conn, l.uid); err != nil {
			l.log.Warn("rejected client connection", "socket", l.path, "err", err)
			_ = conn.Close()
			continue
		}
		return conn, nil
	}
}

// Close implements net.Listener and removes the socket file if it is still
// the one this listener created.
func (l *SocketListener) Close() error {
	l.closeOnce.Do(func() {
		l.closeErr = l.ln.Close()
		var st unix.Stat_t
		if err := unix.Lstat(l.path, &st); err == nil &&
			st.Mode&unix.S_IFMT == unix.S_IFSOCK && uint64(st.Dev) == l.dev && st.Ino == l.ino {
			if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) && l.closeErr == nil {
				l.closeErr = fmt.Errorf("protocol: remove socket %s: %w", l.path, err)
			}
		}
	})
	return l.closeErr
}

// PeerUID returns the uid of the process at the other end of conn
// (SO_PEERCRED, as recorded when the peer connected).
func PeerUID(conn *net.UnixConn) (uint32, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("protocol: peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("protocol: peer credentials: %w", err)
	}
	if credErr != nil {
		return 0, fmt.Errorf("protocol: peer credentials (SO_PEERCRED): %w", credErr)
	}
	return cred.Uid, nil
}

// CheckPeerUID returns nil if conn's peer runs as wantUID, an error wrapping
// ErrPeerUID if it runs as another uid, or the error reading its
// credentials.
func CheckPeerUID(conn *net.UnixConn, wantUID int) error {
	got, err := PeerUID(conn)
	if err != nil {
		return err
	}
	return checkUID(got, wantUID)
}

func checkUID(got uint32, want int) error {
	if want < 0 || uint64(got) != uint64(want) {
		return fmt.Errorf("%w: peer uid %d, ours %d", ErrPeerUID, got, want)
	}
	return nil
}

// ensurePrivateDir creates dir 0700 if missing, or checks that an existing
// dir is a real directory owned by uid and not group/world writable.
func ensurePrivateDir(dir string, uid int) error {
	var st unix.Stat_t
	err := unix.Lstat(dir, &st)
	if errors.Is(err, unix.ENOENT) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("protocol: create socket directory %s: %w", dir, err)
		}
		// MkdirAll honours the umask; make the leaf exactly 0700.
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("protocol: chmod 0700 %s: %w", dir, err)
		}
		err = unix.Lstat(dir, &st)
	}
	if err != nil {
		return fmt.Errorf("protocol: stat socket directory %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		// A symlinked runtime dir (rare) is acceptable only if its target
		// passes the same checks.
		if err := unix.Stat(dir, &st); err != nil {
			return fmt.Errorf("protocol: stat socket directory %s: %w", dir, err)
		}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("protocol: %w: %s is not a directory", ErrUnsafeSocketDir, dir)
	}
	perm := st.Mode & 0o7777
	if int(st.Uid) != uid {
		return fmt.Errorf("protocol: %w: %s is owned by uid %d (mode %04o), not by us (uid %d); "+
			"use a directory of your own, e.g. $XDG_RUNTIME_DIR, or fix it with: chown %d %s && chmod 0700 %s",
			ErrUnsafeSocketDir, dir, st.Uid, perm, uid, uid, dir, dir)
	}
	if perm&0o077 != 0 {
		// Group/world write would let others replace the socket; mere
		// read/search access is refused too because the client itself
		// only connects through a 0700 directory.
		return fmt.Errorf("protocol: %w: %s has mode %04o (owner uid %d) but must be private (0700): "+
			"others can reach or replace the socket; fix it with: chmod 0700 %s",
			ErrUnsafeSocketDir, dir, perm, st.Uid, dir)
	}
	return nil
}

// removeStaleSocket makes path free for bind: nothing there is fine; a stale
// socket is removed; a live socket, a symlink or any other file is refused.
func removeStaleSocket(path string) error {
	var st unix.Stat_t
	err := unix.Lstat(path, &st)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("protocol: stat socket path %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
	case unix.S_IFLNK:
		return fmt.Errorf("protocol: %w: %s is a symlink; refusing to follow it — remove it if it is not meant to be there",
			ErrSocketPathInUse, path)
	default:
		return fmt.Errorf("protocol: %w: %s exists and is not a socket (mode %v); refusing to remove it — move it away and retry",
			ErrSocketPathInUse, path, fs.FileMode(st.Mode&0o777))
	}
	ctx, cancel := context.WithTimeout(context.Background(), staleProbeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err == nil {
		_ = conn.Close()
		return fmt.Errorf("protocol: %w: another server is listening on %s (is a helper already running?)",
			ErrSocketPathInUse, path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("protocol: %w: cannot tell whether %s is stale: %v", ErrSocketPathInUse, path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("protocol: remove stale socket %s: %w", path, err)
	}
	return nil
}
