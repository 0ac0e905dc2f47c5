// Package fs serves host directories to a 9P2000.L server
// (github.com/hugelgupf/p9) as confined exports: each export maps an attach
// name to a host directory, read-only or read-write, and no operation can
// reach a host path outside that directory.
//
// Confinement: every file the guest names is held as an O_PATH descriptor
// opened with openat2(parent, name, O_PATH|O_NOFOLLOW,
// RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_SYMLINKS) relative to the
// descriptor of its parent, starting from the export root's descriptor. A
// walk is one component at a time and names are checked ("", "/", ".",
// ".." and NUL refused), so no path leaves the root through "..", an
// absolute or relative symlink, or a symlink swapped in during a walk: a
// symlink is never followed on the host, only reported to the guest (whose
// kernel resolves it in its own namespace). Operations that need a real
// descriptor or a path-based syscall on a held node (open, chmod, truncate,
// utimes, link) go through /proc/self/fd/N of our own descriptor, which
// names exactly that inode; operations that create or remove names use the
// *at syscalls relative to a held directory descriptor, which never follow
// a final symlink.
//
// Read-only exports answer every mutating operation with EROFS.
//
// Choices for what hugelgupf/p9 leaves to the file system:
//   - Lock (Tlock) always succeeds: the Linux client first takes the lock
//     in the guest kernel, so guest processes exclude each other; the host
//     adds no cross-host locking.
//   - Xattrs: GetXattr → ENODATA, ListXattrs → none, SetXattr/RemoveXattr
//     → EOPNOTSUPP (EROFS on a read-only export). (The p9 server maps any
//     xattr error to EINVAL; the virtio-9p device in the parent package
//     answers Txattrwalk/Txattrcreate itself with the right errno.)
//   - Ownership: files are created as the helper's uid/gid; the guest's
//     uid/gid in Tlcreate/Tmkdir are ignored, and chown is refused unless
//     the helper may do it (EPERM otherwise).
//   - Device nodes cannot be created (EPERM); FIFOs and sockets can.
package fs
