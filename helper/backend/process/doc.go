// Package process is the process backend (COWORK_VMM_BACKEND=process): the
// guest is the same guest agent, re-executed from the helper's own binary as
// `<exe> agent --fd 3 --egress-fd 4`, running on the host in new user,
// mount, PID, UTS, IPC and network namespaces, connected to the helper by an
// inherited socketpair. The sandbox has no network: each spawn's proxy
// hands its connections to the helper over a second, SOCK_SEQPACKET socket
// (fd 4, egress/fdpass), which the guest exposes as helper.Guest.Egress.
//
// The agent is PID 1 of its PID namespace (killing it ends every guest
// process) and, on the helper's setup request (SetupParams.NewRoot), builds
// the guest filesystem of ARCHITECTURE.md in its private mount namespace: a
// tmpfs root with the host's system directories read-only and no host home,
// /root, /run, /tmp or /var. Shares are plain bind mounts of host paths that
// the agent resolves through a descriptor to the host root it keeps (see
// guest/agent's mounter).
//
// No way back to the user's session: the agent starts in a session of its
// own (setsid), so neither it nor any spawn has the terminal `cowork-vmm
// run` was started from as its controlling terminal, and the sandbox's
// /dev has no tty node; every spawn gets a fresh anonymous session keyring
// instead of the user's login one, and runs under guest/seccomp's filter
// (keyctl, add_key, request_key and ioctl TIOCSTI refused among others),
// and /proc/keys and /proc/key-users, which would name the user's keys,
// read as empty. See guest/agent's confine.go and setup.go.
//
// User namespace: the helper's uid and gid map to root inside, so the agent
// may mount, and files written through rw mounts are owned on the host by the
// user running the helper.
package process
