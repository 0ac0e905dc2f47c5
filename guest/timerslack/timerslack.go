package timerslack

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// GuestTick is one tick of the guest kernel (HZ=250): the slack that
	// lets a sleep end on the tick's interrupt.
	GuestTick = 4 * time.Millisecond
	// Default is the kernel's default slack (init's), the one processes
	// started under WithDefault get.
	Default = 50 * time.Microsecond
	// raisePasses bounds Raise's passes over the threads (a thread started
	// during a pass by one not yet done is done in the next).
	raisePasses = 4
)

// Raise gives every thread of the calling process a timer slack of slack;
// threads started later inherit it. It needs CAP_SYS_NICE for the threads
// other than the caller's (a guest's /init is root) and timerslack_ns in
// /proc (Linux 4.6).
func Raise(slack time.Duration) error {
	want := strconv.FormatInt(slack.Nanoseconds(), 10)
	for pass := 0; pass < raisePasses; pass++ {
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
			if strings.TrimSpace(string(b)) == want {
				continue
			}
			if err := os.WriteFile(path, []byte(want), 0); err != nil {
				return fmt.Errorf("setting the timer slack of thread %d: %w", tid, err)
			}
			changed++
		}
		if changed == 0 {
			return nil
		}
	}
	return fmt.Errorf("threads kept starting while their timer slack was set (%d passes)", raisePasses)
}

// threadIDs lists the calling process's threads.
func threadIDs() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("listing the process's threads: %w", err)
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// WithDefault runs start, which starts a process (a fork), on a thread
// whose timer slack is Default for its length: a child's slack, and the
// default it returns to, are its parent thread's at the fork. The thread's
// own slack is restored afterwards.
func WithDefault(start func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err == nil && int64(own) != Default.Nanoseconds() {
		if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(Default.Nanoseconds()), 0, 0, 0); err == nil {
			defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(own), 0, 0, 0)
		}
	}
	return start()
}
