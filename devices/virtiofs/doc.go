// Package virtiofs is the virtio-fs device (virtio id 26): the FUSE
// protocol over a high-priority queue (FORGET, INTERRUPT) and one request
// queue, serving a tree of host exports in process, with no virtiofsd.
// The guest mounts it with `mount -t virtiofs TAG DIR`.
//
// Layers:
//   - device.go, session.go: the virtio.Device. Each activation is a FUSE
//     session (FUSE_INIT to reset). A worker per queue pops chains; each
//     request runs on a goroutine of its own, at most MaxInFlight at once,
//     and completes out of order. Reset waits for every request in flight,
//     then closes every node and open file of the session.
//   - iov.go: a chain as the protocol server sees it. Zero-copy: the
//     request and reply are the chain's guest buffers themselves (through
//     virtio.Slicer), so READ preads into and WRITE pwrites from guest
//     memory; without a Slicer, bounce buffers.
//   - go-fuse's fuse.ProtocolServer parses each request and encodes its
//     reply (github.com/hanwen/go-fuse/v2: the same code its own virtio-fs
//     server uses); we only adapt the transport. SYNCFS, which go-fuse
//     does not serve, the session answers itself: the guest's sync(2)
//     syncs the host file systems of the writable exports.
//   - fs.go, names.go, io.go, nodes.go: the FUSE file system, over the
//     export layer of package hostfs, the one the virtio-9p device uses.
//     Each FUSE operation maps onto a hostfs.Node directly (an open is a
//     Clone opened, a read or write one preadv or pwritev); nothing of 9P
//     is involved. A FUSE node is a hostfs.Node, keyed by hostfs.Key
//     (export, host device, host inode) so the guest gets one node id per
//     inode and a node reached through a read-only export is never the
//     one of a read-write export.
//     Everything the 9p device guarantees about host files therefore holds
//     here too: each name resolved by openat2 beneath a held directory
//     descriptor, no symlink followed on the host, read-only exports
//     refusing every mutation with EROFS, withdrawn exports failing with
//     ESTALE at once, set-id bits never planted, only regular files and
//     directories opened on the host.
//
// Caching (Options.Cached): a cached device (the read-only system
// directories) gives the guest day-long entry and attribute lifetimes and
// keeps its page cache across opens; an uncached one gives lifetimes of
// one second (virtiofsd's default, cache=auto) and drops the page cache at
// each open, so an open after a host edit reads the edit (close-to-open,
// as NFS), an open through a name the host replaced gets ESTALE and the
// guest's fresh lookup, and a changed name or attribute is seen within a
// second. A cached device may also be NoOpen (Options.NoOpen; the helper's
// system directories, all read-only): its OPEN is ENOSYS, so the guest
// opens files without asking and reads them by node, with no OPEN or
// RELEASE round trip for each file a program opens. ListNamesOnly
// (Options.ListNamesOnly, the system directories too) lists directories
// with READDIR, so a listing costs no host lookup per entry. A single
// file on a cached device (the SDK binary) is to be an immutable export
// (hostfs.Exports.AddImmutableFile): it serves the inode shared, never a
// file the host puts at its name later, so the pages the guest keeps and
// those it reads later are of one file.
//
// The guest is hostile:
//   - a request's readable bytes are bounded (maxMessage, else E2BIG) and
//     the reply room used is bounded the same way, so no request makes the
//     host allocate more than about MaxWrite;
//   - go-fuse copies the header and fixed arguments out of guest memory
//     before checking them, and names become Go strings, so a guest that
//     rewrites its buffers mid-request changes only its own data;
//   - a panic while serving a request is EIO for that request only;
//   - node and handle ids are never reused in a session, unknown ids are
//     ESTALE or EBADF, FORGET of more than was looked up forgets the node,
//     and both tables are bounded (MaxNodes, MaxHandles), beyond which
//     lookups and opens fail with ENFILE; a NoOpen device's nodes keeping
//     a reader are bounded by MaxHandles too, beyond which each READ opens
//     and closes its own;
//   - the host descriptors behind all of them — a node's one, an open
//     handle's two (a clone and its open file), a reader's two, and a
//     forgotten directory's one while a node below it lives — come out of
//     the export layer's descriptor budget (the Root's, see package
//     hostfs), so however the guest orders its lookups, opens and FORGETs,
//     the device holds at most that budget; past it a lookup, open or
//     READ fails with ENFILE and the device keeps serving (a lookup of a
//     name whose node the guest holds is still answered, from that node:
//     Node.ChildKey finds it without opening anything);
//   - a request the server cannot take is answered with an error header,
//     never left pending.
//
// Snapshots (state.go, restore.go; virtio.StateSaver): a guest suspended
// with its mounts in place keeps its FUSE node ids, so the device saves
// its session with the VM: the FUSE_INIT request go-fuse accepted
// (replayed into the restored session's server, so its negotiated
// settings are the guest's), the id counters (ids stay never reused
// across the restore), and each node the guest holds with its lookup
// count, file type, host device and inode and its place (export name and
// path components, hostfs.PathOf). Restored over a fresh Exports holding
// the same exports under the same names, each node is walked to again
// from the attach root, each directory on the way once, and kept only if
// it is still the same inode: a file the host replaced meanwhile is left
// out (ESTALE under its old id, and the guest looks its name up again),
// a file edited in place reads its new bytes, and an export root the
// guest holds that is gone or another directory fails the restore (the
// caller boots cold). A session holding open handles refuses to be
// saved; an inactive device saves "no session" and restores to start
// afresh. The state (JSON, versioned) is checked as guest input: counts
// within the table's limits, ids within the counters, names as Walk
// takes them.
//
// Not offered: DAX, notifications, locks (the guest kernel keeps them
// local), xattrs, fallocate, lseek, copy_file_range and RENAME2 flags
// (ENOSYS: the guest kernel stops asking and answers for itself).
package virtiofs
