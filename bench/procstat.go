package bench

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcStat is what the work accounting reads of /proc/PID/stat.
type ProcStat struct {
	PID, PPID int
	// UTime and STime are the process's own user and system time (every
	// thread's); CUTime and CSTime its reaped children's.
	UTime, STime, CUTime, CSTime time.Duration
	// GuestTime and CGuestTime are the part of UTime and CUTime a vCPU
	// spent running a guest (fields 43 and 44; 0 on kernels without
	// them).
	GuestTime, CGuestTime time.Duration
}

// CPU is the process's CPU time, its reaped children's included.
func (s ProcStat) CPU() time.Duration { return s.UTime + s.STime + s.CUTime + s.CSTime }

// Guest is the part of CPU spent running a guest.
func (s ProcStat) Guest() time.Duration { return s.GuestTime + s.CGuestTime }

// tick is the duration of a clock tick, and maxTicks bounds a CPU time in
// ticks: four of them (CPU's sum) fit a time.Duration (73 years each).
const (
	tick     = time.Second / clockTicks
	maxTicks = math.MaxInt64 / 4 / int64(tick)
)

// maxProcStat bounds /proc/PID/stat (a few hundred bytes; comm is at most
// 16 bytes, but a hostile process's name is no reason to read without
// bound).
const maxProcStat = 4096

// ParseProcStat parses /proc/PID/stat text: "pid (comm) state ppid …",
// where comm may hold spaces and parentheses (the last ')' ends it), and
// utime, stime, cutime, cstime are fields 14–17, in clock ticks.
func ParseProcStat(text []byte) (ProcStat, error) {
	s := strings.TrimSpace(string(text))
	lp, rp := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if lp < 1 || rp < lp {
		return ProcStat{}, fmt.Errorf("/proc stat: no \"pid (comm)\" in %q", truncate(s, 80))
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s[:lp]))
	if err != nil || pid <= 0 {
		return ProcStat{}, fmt.Errorf("/proc stat: bad pid %q", truncate(s[:lp], 20))
	}
	// After comm: state (field 3), ppid (4), … utime (14) … cstime (17).
	rest := strings.Fields(s[rp+1:])
	if len(rest) < 15 {
		return ProcStat{}, fmt.Errorf("/proc stat of %d: %d fields after comm, want at least 15", pid, len(rest))
	}
	num := func(field int) (int64, error) {
		v, err := strconv.ParseInt(rest[field-3], 10, 64)
		if err != nil || v < 0 || v > maxTicks {
			return 0, fmt.Errorf("/proc stat of %d: field %d is %q, want a count", pid, field, rest[field-3])
		}
		return v, nil
	}
	st := ProcStat{PID: pid}
	ppid, err := num(4)
	if err != nil {
		return ProcStat{}, err
	}
	st.PPID = int(ppid)
	for i, dst := range []*time.Duration{&st.UTime, &st.STime, &st.CUTime, &st.CSTime} {
		ticks, err := num(14 + i)
		if err != nil {
			return ProcStat{}, err
		}
		*dst = time.Duration(ticks) * tick
	}
	if len(rest) >= 44-2 {
		for i, dst := range []*time.Duration{&st.GuestTime, &st.CGuestTime} {
			ticks, err := num(43 + i)
			if err != nil {
				return ProcStat{}, err
			}
			*dst = time.Duration(ticks) * tick
		}
	}
	return st, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// readProcStat reads and parses proc/PID/stat.
func readProcStat(proc string, pid int) (ProcStat, error) {
	b, err := readSmall(filepath.Join(proc, strconv.Itoa(pid), "stat"), maxProcStat)
	if err != nil {
		return ProcStat{}, err
	}
	return ParseProcStat(b)
}

// cpu is the CPU time (and its guest part) of pids and of their live
// descendants (found by
// their parent pids: /proc/PID/task/*/children needs CONFIG_PROC_CHILDREN);
// a reaped child's time is in its parent's cutime and cstime. A process
// that no longer exists counts nothing.
func (m WorkMeter) cpu(pids []int) (total, guest time.Duration, err error) {
	if len(pids) == 0 {
		return 0, 0, nil
	}
	all, err := m.processes()
	if err != nil {
		return 0, 0, err
	}
	children := map[int][]int{}
	for _, st := range all {
		children[st.PPID] = append(children[st.PPID], st.PID)
	}
	seen := map[int]bool{}
	pending := append([]int(nil), pids...)
	for len(pending) > 0 {
		pid := pending[len(pending)-1]
		pending = pending[:len(pending)-1]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		if st, ok := all[pid]; ok {
			total += st.CPU()
			guest += st.Guest()
		}
		pending = append(pending, children[pid]...)
	}
	return total, guest, nil
}

// processes reads the stat of every process in proc. A process that ends
// while it is read is left out; one whose stat does not parse is an error.
func (m WorkMeter) processes() (map[int]ProcStat, error) {
	entries, err := os.ReadDir(m.proc())
	if err != nil {
		return nil, fmt.Errorf("not measured: reading %s: %w", m.proc(), err)
	}
	out := map[int]ProcStat{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		st, err := readProcStat(m.proc(), pid)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("not measured: %w", err)
		}
		out[pid] = st
	}
	return out, nil
}
