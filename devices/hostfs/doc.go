// Package hostfs owns the export layer shared by both file servers: it
// serves host directories as confined exports to the FUSE server of
// package devices/virtiofs and the 9P2000.L server of package devices/p9.
// Each export maps an attach name to a host directory, read-only or
// read-write, and no operation can reach a host path outside that
// directory.
//
// It owns: the registry (Exports: Add, AddFile, AddImmutableFile, ShowOwnedAs, Remove, Root,
// SyncWritable), the Node interface both servers map their requests onto
// (node.go: one-component Walk, Clone, Stat, ChildKey, SetAttr, Open,
// ReadvAt/WritevAt, Readdir, Create/Mkdir/Symlink/Mknod/Link, Rename/
// RenameAt/UnlinkAt, xattrs; errors are unix.Errno, exactly what the
// guest gets), the node Key (one per export and host inode), PathOf (the
// export name and components that walk to a node again, for a client
// that keeps its nodes across a VM snapshot), the
// descriptor budget and the ownership rule below. Neither server's
// vocabulary appears here: virtio-fs uses Nodes directly, virtio-9p
// through a p9.File adapter of its own (devices/p9/node.go).
//
// Confinement: every file the guest names is held as an O_PATH descriptor
// opened by internal/beneath.OpenAt, the one confined open: openat2(parent, name, O_PATH|O_NOFOLLOW,
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
// Descriptors: every host descriptor a Node holds for a client — a walked
// node's O_PATH one, an open file's, each clone the client opens — is
// acquired from the Exports' budget (NewExportsWithin: a device's share
// of the helper-wide fdlimit.Pool) before it is opened, and given back
// when it is closed; past the budget a walk, open or create fails with
// ENFILE. A Node keeps its parent's descriptor open while it lives
// (renaming it and setting a symlink's times go through the parent), so a
// directory the client closed (a 9P clunk, a FUSE forget) stays counted
// until its last child goes: what the budget counts is what the process
// holds, however the client orders its closes. (The descriptors an operation opens and
// closes before it returns are not counted: a device runs a bounded
// number of operations at once, and the pool's reserve covers them.)
//
// A single-file export (Exports.AddFile) serves one host file as the only
// entry of a directory: the guest can walk to, list, read and (read-write)
// write and chmod that file, nothing else of the directory holding it. The
// file is found by name beneath that directory's descriptor each time, so
// an editor's save by rename-over on the host shows; see AddFile. An
// immutable one (Exports.AddImmutableFile: read-only, for a file the
// guest caches for good, the SDK binary) is pinned instead to the inode
// it was registered with, so what the guest cached and what it reads
// later are of one file; a new file is a new export.
//
// Withdrawal: Exports.Remove revokes an export at once. New walks to it
// fail, every operation on a Node the guest still holds in it fails with
// ESTALE, and every host descriptor of the export is closed before Remove
// returns (not when the client closes its Nodes). An RWMutex per export (held shared by each
// operation, exclusively by the revocation) keeps a descriptor from being
// closed, and its number reused, under an operation.
//
// Directory listings are not cached: Readdir's offset is the host's own
// directory position (getdents64's d_off, which lseek takes back), so a
// listing holds no memory between requests however many Nodes read it;
// one request reads at most count bytes of entries, at 9P's size of an
// entry (count clamped to 1 MiB here, and to the negotiated msize by the
// virtio-9p device).
//
// Set-user-ID and set-group-ID bits never come from the guest: they are
// dropped from the mode of Create, Mkdir, Mknod and SetAttr, and cleared
// on the host file before a write or a truncation (SetAttr's size, Open's
// O_TRUNC) — the set-group-ID bit only on a group-executable file —
// as Linux does for a writer without CAP_FSETID and virtiofsd's
// killpriv_v2 relies on. The helper may run with CAP_FSETID; a guest must
// not be able to plant or modify a privileged program on the host.
//
// Choices the servers leave to the layer:
//   - Locks: 9P's Tlock always succeeds once Check finds the export still
//     there: the Linux client first takes the lock in the guest kernel,
//     so guest processes exclude each other; the host adds no cross-host
//     locking.
//   - Xattrs: GetXattr → ENODATA, ListXattrs → none, SetXattr/RemoveXattr
//     → EOPNOTSUPP (EROFS on a read-only export). (The p9 server maps any
//     xattr error to EINVAL; the virtio-9p device answers
//     Txattrwalk/Txattrcreate itself with the right errno.)
//   - Ownership: files are created as the helper's uid/gid; Create,
//     Mkdir, Symlink and Mknod take no owner, and SetAttr (9P's Tsetattr,
//     virtio-fs's SETATTR) never gives a file to another owner: a uid or gid
//     other than the helper's effective ones is EPERM before the host is
//     asked, even when the helper runs as root and the host would let it
//     chown; naming our own (or neither) works. An export added with
//     ShowOwnedAs (a session's) reports the helper's uid and gid as that
//     owner's, and takes a chown to it as one to the helper's (owner.go).
//   - Device nodes cannot be created (EPERM); FIFOs and sockets can.
package hostfs
