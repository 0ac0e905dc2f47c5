package agent

// Every spawn (and every process the guest tool's sudo starts, which is a
// spawn too) is forked from an OS thread of its own that dies after the
// fork (onOwnThread, or the spawn's network namespace's thread), which
// confineSpawnThread sets up first:
//
//   - a fresh anonymous session keyring: the agent's own is the one it
//     was started with — in the process backend the user's login session
//     keyring, holding Kerberos tickets and fscrypt or ecryptfs keys —
//     and a child inherits its parent thread's. In the VM the agent's is
//     its kernel's, and the guest kernel has no keyrings at all (ENOSYS),
//     which is as good;
//   - the seccomp filter of guest/seccomp (keyrings, TIOCSTI, kernel
//     attack surface), with no_new_privs. Filters are per thread and a
//     child inherits its parent thread's, so the agent's other threads
//     stay unfiltered, and the thread goes with its goroutine;
//   - a nice value spawnNiceIncrement above the agent's: the agent
//     outranks what it runs for the CPU, so that a session saturating the
//     guest's vCPUs does not starve its pings (the helper would declare the
//     guest dead). Nice is per thread on Linux and a child inherits its
//     forking thread's; raising it needs no privilege, so this works in the
//     process backend too, where the agent cannot go below 0.
//
// Tools the agent runs as itself (runTool) are forked from the agent's
// threads, without either.

import (
	"errors"
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/seccomp"
)

// confineSpawnThread readies the calling thread, which must be locked and
// must not outlive the fork, for forking a spawn: a session keyring of its
// own, a lower priority, then the filter.
func confineSpawnThread(filter []bpf.RawInstruction) error {
	if err := joinFreshSessionKeyring(); err != nil {
		return err
	}
	if err := lowerThreadPriority(spawnNiceIncrement); err != nil {
		return err
	}
	if err := seccomp.Install(filter); err != nil {
		return fmt.Errorf("the process's system call filter: %w", err)
	}
	return nil
}

// spawnNiceIncrement is how far a spawn's nice value is above the agent's:
// at +10 a busy spawn gets about a tenth of the CPU weight of the agent
// (CFS weights 1024 against 110).
const spawnNiceIncrement = 10

// lowerThreadPriority raises the calling thread's nice value by increment,
// up to the highest (19).
func lowerThreadPriority(increment int) error {
	tid := unix.Gettid()
	// The system call's value is 20 - nice (1…40), not the nice value.
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return fmt.Errorf("the process's priority: %w", err)
	}
	nice := min(20-raw+increment, 19)
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil {
		return fmt.Errorf("lowering the process's priority to nice %d: %w", nice, err)
	}
	return nil
}

// joinFreshSessionKeyring gives the calling thread a new anonymous session
// keyring (KEYCTL_JOIN_SESSION_KEYRING with no name), in place of the one
// it inherited. A kernel without keyrings has nothing to hand on.
func joinFreshSessionKeyring() error {
	_, _, errno := unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0)
	switch {
	case errno == 0, errno == unix.ENOSYS:
		return nil
	case errors.Is(errno, unix.EDQUOT):
		return fmt.Errorf("a session keyring of its own for the process: the user's key quota is used up (kernel.keys.maxkeys): %w", errno)
	default:
		return fmt.Errorf("a session keyring of its own for the process: %w", errno)
	}
}
