// Package seccomp builds and installs the seccomp filter every spawned
// process runs under (guest/agent forks spawns on a thread that has it; a
// child inherits its parent thread's filters, and so does everything the
// child starts), and answers whether this kernel can install it (doctor).
//
// The filter is a short deny list, not an allow list: spawns run arbitrary
// developer tools (compilers, node, python, bubblewrap with its own
// filter), so it refuses, with EPERM, only what a sandboxed process has no
// use for and what has been used to get out of one:
//
//   - ioctl TIOCSTI and TIOCLINUX: pushing bytes into a terminal's input
//     (the commands run in the user's shell once we exit) or the console's;
//   - keyctl, add_key, request_key: the kernel keyrings (Kerberos tickets,
//     fscrypt and ecryptfs keys live there);
//   - syslog, acct, quotactl(_fd), swapon, swapoff, reboot, the module and
//     kexec calls, settimeofday, clock_settime, open_by_handle_at, bpf,
//     userfaultfd, perf_event_open, lookup_dcookie, vhangup, nfsservctl and
//     on x86-64 uselib, _sysctl, iopl, ioperm and modify_ldt: host-wide
//     state, kernel attack surface or obsolete calls (the lists of
//     Flatpak's setup_seccomp and Docker's default profile, less what they
//     keep for developer tools);
//   - personality other than PER_LINUX, PER_LINUX32 or the query.
//
// Allowed on purpose, unlike Flatpak: unshare, clone and setns with
// namespace flags, mount, umount2, pivot_root and chroot. Spawns run
// bubblewrap (Claude Code's sandbox) inside the guest and sudo mount may be
// wanted; the namespaces they make are nested in the spawn's own, where
// the agent's mounts are locked. Also allowed: ptrace (debuggers, strace,
// on the spawn's own children only), io_uring (node, bun), NUMA policy
// calls and clock_adjtime/adjtimex (reading the clock's state).
//
// The architecture is checked first: a system call made through another
// ABI than the agent's own (the 32-bit x86 entry on x86-64, 32-bit ARM on
// arm64) kills the process, since the numbers the list names are only the
// native ones; x32 calls on x86-64 are refused with EPERM.
//
// The program is classic BPF assembled with golang.org/x/net/bpf; no cgo,
// no libseccomp.
package seccomp
