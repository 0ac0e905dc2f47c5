package agent

// The agent's timer slack, and the timer interrupts it saves a VM.
//
// The Go runtime's sysmon thread sleeps 20 µs at a time (nanosleep) while
// a goroutine is in a system call, so that it can hand that goroutine's P
// to another thread; it backs off to 10 ms only once it has had nothing to
// do for a while. The agent spends its set-up in system calls (mounts,
// opens), so sysmon asks the guest kernel for a timer interrupt every
// 20 µs, and each one is several exits to the host (the timer's expiry,
// the interrupt window, the re-armed TSC deadline). In the nested harness
// the guest took 700–1000 local timer interrupts a second through the
// agent's set-up, against its tick's 250.
//
// With a timer slack of agentTimerSlack on every thread of the agent, the
// kernel serves those sleeps with the interrupts it takes anyway (the
// tick). sysmon starts threads of its own (a thread inherits the slack of
// the one that starts it), so the slack is the whole agent's, not
// sysmon's alone: the agent's own timers may end up to agentTimerSlack
// late (its output coalescing window, 5 ms, becomes 5–9 ms). The
// processes the agent starts get the kernel's default instead (forkExec).

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// agentTimerSlack is one tick of the guest kernel (HZ=250).
	agentTimerSlack = 4 * time.Millisecond
	// defaultTimerSlack is the kernel's default (init's), which the
	// processes the agent starts keep.
	defaultTimerSlack = 50 * time.Microsecond
	// slackPasses bounds slowAgentTimers' passes over the agent's threads
	// (a thread started during a pass by one not yet done is done in the
	// next).
	slackPasses = 4
)

// slowAgentTimers gives every thread of the agent a timer slack of
// agentTimerSlack (see the file comment). Threads started later inherit
// it. It needs CAP_SYS_NICE for the threads other than the caller's (the
// VM's agent is root) and timerslack_ns in /proc (Linux 4.6).
func slowAgentTimers() error {
	want := agentTimerSlack.Nanoseconds()
	for pass := 0; pass < slackPasses; pass++ {
		tids, err := threadIDs()
		if err != nil {
			return err
		}
		changed := 0
		for _, tid := range tids {
			path := fmt.Sprintf("/proc/%d/timerslack_ns", tid)
			b, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("the timer slack of thread %d: %w", tid, err)
			}
			if strings.TrimSpace(string(b)) == strconv.FormatInt(want, 10) {
				continue
			}
			if err := os.WriteFile(path, []byte(strconv.FormatInt(want, 10)), 0); err != nil {
				return fmt.Errorf("setting the timer slack of thread %d: %w", tid, err)
			}
			changed++
		}
		if changed == 0 {
			return nil
		}
	}
	return fmt.Errorf("the agent kept starting threads while their timer slack was set (%d passes)", slackPasses)
}

// threadIDs lists the calling process's threads.
func threadIDs() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("listing the agent's threads: %w", err)
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// forkExec is syscall.ForkExec from a thread whose timer slack is the
// kernel's default for the length of the fork, so that the process it
// starts does not inherit the agent's (a child's slack, and the default it
// returns to, are its parent thread's at the fork).
func forkExec(path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err == nil && int64(own) != defaultTimerSlack.Nanoseconds() {
		if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(defaultTimerSlack.Nanoseconds()), 0, 0, 0); err == nil {
			defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(own), 0, 0, 0)
		}
	}
	return syscall.ForkExec(path, argv, attr)
}
