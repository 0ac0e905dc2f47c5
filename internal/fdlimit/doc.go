// Package fdlimit raises the process's open-file limit (RLIMIT_NOFILE) for
// the file-sharing devices, and says what it allows.
//
// A virtio-fs or virtio-9p device holds one host descriptor for every file
// the guest kernel keeps looked up (as virtiofsd does), and the guest
// forgets them only under memory pressure: dpkg reading its database
// (~3000 files) or `git status` on a large tree holds thousands. With the
// kernel's default hard limit of 4096 — what a process started without
// systemd, or by the nested harness's init, gets — the helper ran out, and
// the guest's programs failed with "Too many open files". Raise lifts the
// soft limit to the hard one (Go does that much at start-up too) and,
// where the process may (CAP_SYS_RESOURCE: a helper run as root), both to
// the kernel's nr_open.
//
// Pool is the descriptor budget itself: one per helper process, shared by
// every device of every running VM. Each device takes a Share of it and
// acquires every host descriptor it holds for its guest (looked-up files,
// open files, readers) before opening it. The shares together never pass
// RLIMIT_NOFILE less a reserve (Reserve) for the helper's own sockets and
// files, and each share gets an equal part, so more VMs each get less;
// past its part a device answers its guest ENFILE and the helper keeps
// serving.
package fdlimit
