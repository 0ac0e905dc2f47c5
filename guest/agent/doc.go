// Package agent is the guest agent: the one process that runs inside every
// guest (PID 1 of the VM, or the init of the process backend's namespace
// sandbox) and carries out the helper's requests over the agent channel of
// protocol/agent.go, served by protocol/agentrpc's Server (agent.go
// registers a typed handler per method) — laying out the root filesystem, mounting shares,
// spawning processes and streaming their output, forwarding stdin, signalling
// process groups, reporting exits, reaping every child, reading files.
//
// Egress: with Options.Egress set (vsock in the VM, --egress-fd in the
// process backend) every spawn is forked into a network namespace of its own
// with only loopback, where its HTTP proxy (guest/proxy) listens; the
// proxy's variables are merged into its environment, and the proxy closes
// when the process exits.
//
// Isolation (Options.IsolateSessions, the VM): each spawn runs as its
// session's own uid, in user, mount and IPC namespaces of its own, on a root
// that holds the system directories and only its own session; the agent is
// non-dumpable. See isolate.go for the design and how the process backend
// differs.
//
// Confinement (confine.go), VM and process backend alike: every spawn is
// forked from a thread of its own that joined a fresh anonymous session
// keyring, installed guest/seccomp's filter (keyrings, TIOCSTI, kernel
// attack surface refused) and raised its nice value by 10 (the agent
// outranks its processes for the CPU, so a busy session does not starve
// its pings); the child inherits all three, the agent does not.
//
// Guest requests (guestrequest.go): every spawn gets a Unix socket of its
// own, named in its environment (protocol.GuestRequestSocketEnv) — in an
// isolated spawn's own /run — whose calls become request events to the
// helper and are answered by its guestResponse; `cowork-vmm guest-request`
// (guestcall.go), found in the guest at protocol.GuestToolPath, makes one.
//
// sudo (sudo.go): the guest tool as sudo asks the agent, over that socket,
// to run a command as uid 0 of a user namespace mapped to the session's
// uid, with file capabilities only; with a root disk, /var and the dpkg
// database live on it (rootvar.go), so apt-get and dpkg work through it.
//
// The client's bundle image (imageroot.go, SetupParams.ImageRoot: the VM
// booting the client's VM bundle): the image's root volume, a disk found by
// serial, mounted ext4 read-write in the staging directory (its writes
// land in the host's copy-on-write layer), its other images mounted where
// its /etc/fstab says by LABEL=, and its usr, etc, opt, var, home, root,
// srv and bin/sbin/lib* made the guest's system directories.
//
// Cgroups (cgroup.go, Options.CgroupRoot: the VM): every spawn runs in a
// cgroup v2 of its own below a parent limited under the guest's memory; its
// exit reports the cgroup's oom_kill count as oomKillCount.
//
// Mount points (mountpoint.go): every mount target, and every directory or
// file made on the way to one, is walked component by component beneath a
// root descriptor with the confined open (internal/beneath.OpenAt: openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), and the
// mount made onto the held descriptor: a symlink a session's process
// planted or swapped in (towards another session's home, or /) makes the
// mount fail, naming it; it is never followed.
//
// Files: agent.go (Run, its methods on agentrpc.Server), spawn.go
// (starting a process, step by step), process.go (the process table, reaping, output, stdin, kill),
// credit.go (output flow control: a process sends within its credit),
// isolate.go, confine.go, mount.go, mountpoint.go, setup.go, guestrequest.go,
// guestcall.go, sudo.go, rootdisk.go, imageroot.go, rootvar.go, sessiontmp.go, cgroup.go, utf8chunk.go, main.go (ProcessMain, VMMain),
// vsock.go.
//
// Entry points: Run serves one connection; ProcessMain is the
// `cowork-vmm agent --fd N [--egress-fd M]` mode of the process backend; VMMain is the PID 1
// (/init) mode of the VM.
//
// Reaping design: Run owns every child of the calling process. One reaper
// goroutine, woken by SIGCHLD, calls wait4(-1, WNOHANG) until nothing is left
// to reap; a status whose pid belongs to a spawned process goes to that
// process, any other (an orphan reparented to us as PID 1 or as subreaper) is
// discarded. Spawning happens under the process-table lock, so the reaper can
// never see a pid before it is in the table. Because of that global wait,
// nothing else in the agent's process may start children (no os/exec), and
// at most one Run may be active per process.
package agent
