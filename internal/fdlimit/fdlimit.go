package fdlimit

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const (
	// nrOpenPath holds the most descriptors a process may be allowed.
	nrOpenPath = "/proc/sys/fs/nr_open"
	// defaultNROpen is the kernel's default nr_open, when it cannot be read.
	defaultNROpen = 1 << 20
	// Low is the limit below which file sharing may run short on large
	// trees: doctor and the kvm backend say so.
	Low = 1 << 16
	// reserve is what a Pool leaves for everything else the helper opens
	// (sockets, the VM, disks, its log): see Reserve.
	reserve = 1024
)

// Raise lifts RLIMIT_NOFILE as far as the process may: both limits to
// nr_open where it may raise the hard limit, else the soft limit to the
// hard one. It returns the soft limit in force afterwards.
func Raise() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if want := nrOpen(); rl.Max < want {
		up := unix.Rlimit{Cur: want, Max: want}
		if unix.Setrlimit(unix.RLIMIT_NOFILE, &up) == nil {
			return want, nil
		}
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			return 0, err
		}
	}
	return rl.Cur, nil
}

// nrOpen reads the kernel's nr_open.
func nrOpen() uint64 {
	b, err := os.ReadFile(nrOpenPath)
	if err != nil {
		return defaultNROpen
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n == 0 {
		return defaultNROpen
	}
	return n
}
