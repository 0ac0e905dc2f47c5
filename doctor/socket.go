package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
)

// SocketName is the client's socket file in its runtime directory.
const SocketName = "claude-cowork-vm.sock"

// SocketDir is where the client puts its socket: $XDG_RUNTIME_DIR, else a
// 0700 directory <tmpdir>/claude-cowork-<uid>/ (CLIENT-FACTS.md); fromEnv
// says which.
func SocketDir(getenv func(string) string, uid int) (dir string, fromEnv bool) {
	if d := getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Clean(d), true
	}
	tmp := getenv("TMPDIR")
	if tmp == "" {
		tmp = "/tmp"
	}
	return filepath.Join(tmp, "claude-cowork-"+strconv.Itoa(uid)), false
}

func (r *runner) socketDir() (dir string, fromEnv bool) {
	return SocketDir(r.h.Getenv, r.h.Getuid())
}

// socketChecks mirrors what protocol.Listen demands of the socket's
// directory and path, so doctor fails exactly where the helper would.
func (r *runner) socketChecks() bool {
	dir, fromEnv := r.socketDir()
	rd, dirOK, dirExists := r.runtimeDirCheck(dir, fromEnv)
	r.add(rd)
	sp, sockOK := r.socketPathCheck(filepath.Join(dir, SocketName), dirOK, dirExists)
	r.add(sp)
	return dirOK && sockOK
}

// runtimeDirCheck judges the socket's directory: usable (ok), and whether
// it exists yet (the helper creates a missing default one).
func (r *runner) runtimeDirCheck(dir string, fromEnv bool) (rd Check, ok, exists bool) {
	uid := r.h.Getuid()
	rd = Check{ID: CheckRuntimeDir, Group: GroupCoworkVMM, Title: "Socket directory"}
	if fromEnv && !filepath.IsAbs(dir) {
		rd.Status = StatusFail
		rd.Detail = fmt.Sprintf("XDG_RUNTIME_DIR=%s is not an absolute path", dir)
		rd.Fix = "log in through a systemd/logind session (it sets XDG_RUNTIME_DIR=/run/user/$UID), or unset XDG_RUNTIME_DIR"
		return rd, false, false
	}
	info, err := r.h.Stat(dir) // a symlinked runtime dir is judged by its target, as protocol.Listen does
	switch {
	case err != nil && errors.Is(err, fs.ErrNotExist) && !fromEnv:
		rd.Status = StatusWarn
		rd.Detail = fmt.Sprintf("XDG_RUNTIME_DIR is not set: the client will use %s (the helper creates it 0700)", dir)
		rd.Fix = "start Claude Desktop from a logind session (pam_systemd sets XDG_RUNTIME_DIR=/run/user/$UID) so both ends agree on the socket"
		return rd, true, false
	case err != nil && errors.Is(err, fs.ErrNotExist):
		rd.Status = StatusFail
		rd.Detail = fmt.Sprintf("XDG_RUNTIME_DIR=%s does not exist", dir)
		rd.Fix = fmt.Sprintf("log in again through a systemd/logind session (it creates /run/user/$UID), or: sudo install -d -m 0700 -o %d %s", uid, dir)
	case err != nil:
		rd.Status = StatusFail
		rd.Detail = fmt.Sprintf("cannot look at %s: %v", dir, err)
		rd.Fix = "run doctor as the user who runs Claude Desktop"
	case !info.IsDir():
		rd.Status = StatusFail
		rd.Detail = fmt.Sprintf("%s is not a directory (%v)", dir, info.Mode())
		rd.Fix = "move it away; the helper then creates the directory 0700"
	default:
		return rd, privateDirCheck(&rd, info, dir, uid, fromEnv), true
	}
	return rd, false, false
}

// privateDirCheck fills rd for an existing directory: ours and 0700.
func privateDirCheck(rd *Check, info fs.FileInfo, dir string, uid int, fromEnv bool) bool {
	perm := info.Mode().Perm()
	ownerUID, known := owner(info)
	rd.Status = StatusFail
	rd.Fix = "chmod 0700 " + dir
	switch {
	case known && ownerUID != uid:
		rd.Detail = fmt.Sprintf("%s is owned by uid %d, not by us (uid %d): the helper refuses to serve from it", dir, ownerUID, uid)
		rd.Fix = fmt.Sprintf("sudo chown %d %s && chmod 0700 %s", uid, dir, dir)
	case perm&0o022 != 0:
		rd.Detail = fmt.Sprintf("%s has mode %04o: group/world-writable, others could replace the socket; the helper refuses to serve from it", dir, perm)
	case perm&0o077 != 0:
		rd.Detail = fmt.Sprintf("%s has mode %04o: others can reach the socket; the helper (like the client) only uses a private 0700 directory", dir, perm)
	case perm&0o700 != 0o700:
		rd.Detail = fmt.Sprintf("%s has mode %04o: we cannot create the socket in it", dir, perm)
	case !fromEnv:
		rd.Status = StatusWarn
		rd.Detail = fmt.Sprintf("XDG_RUNTIME_DIR is not set: the client will use %s, which is private (0700, ours)", dir)
		rd.Fix = "start Claude Desktop from a logind session (pam_systemd sets XDG_RUNTIME_DIR=/run/user/$UID)"
		return true
	default:
		rd.Status, rd.Fix = StatusOK, ""
		rd.Detail = fmt.Sprintf("%s is private (0700, ours)", dir)
		return true
	}
	return false
}

// socketPathCheck judges the socket path itself: free, or a socket the
// helper may replace.
func (r *runner) socketPathCheck(sock string, dirOK, dirExists bool) (sp Check, ok bool) {
	sp = Check{ID: CheckSocketPath, Group: GroupCoworkVMM, Title: "Socket path"}
	if !dirExists {
		if !dirOK {
			skipAll("no usable socket directory", &sp)
			return sp, false
		}
		sp.Status = StatusOK
		sp.Detail = sock + " is free (its directory does not exist yet)"
		return sp, true
	}
	info, err := r.h.Lstat(sock)
	switch {
	case err != nil && errors.Is(err, fs.ErrNotExist):
		sp.Status = StatusOK
		sp.Detail = sock + " is free"
		return sp, true
	case err != nil:
		sp.Status = StatusFail
		sp.Detail = fmt.Sprintf("cannot look at %s: %v", sock, err)
		sp.Fix = "run doctor as the user who runs Claude Desktop"
	case info.Mode()&fs.ModeSymlink != 0:
		sp.Status = StatusFail
		sp.Detail = sock + " is a symlink: the helper never follows one and refuses to serve"
		sp.Fix = "rm " + sock + " (nothing legitimate puts a symlink there)"
	case info.Mode()&fs.ModeSocket == 0:
		sp.Status = StatusFail
		sp.Detail = fmt.Sprintf("%s exists and is not a socket (%v): the helper will not remove it", sock, info.Mode())
		sp.Fix = "move it away: mv " + sock + " " + sock + ".old"
	default:
		sp.Status = StatusOK
		sp.Detail = sock + " is a socket: a helper is running, or it is stale (the helper removes a stale one when it starts)"
		return sp, true
	}
	return sp, false
}
