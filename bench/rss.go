package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Memory is one sample of a VMM process's memory, in KiB.
type Memory struct {
	// RSS and HWM are VmRSS and VmHWM (peak) from /proc/PID/status.
	RSSKiB int64 `json:"rss_kib"`
	HWMKiB int64 `json:"hwm_kib"`
	// GuestKiB is the resident part of the guest-RAM mapping (what the
	// guest touched); VMMKiB is RSS without it: the VMM's own footprint.
	// Both are 0 when no guest-RAM mapping was found (Separated false).
	GuestKiB  int64 `json:"guest_kib"`
	VMMKiB    int64 `json:"vmm_kib"`
	Separated bool  `json:"separated"`
}

// ReadMemory samples pid's memory. guestBytes is the guest RAM size (0: no
// guest in this process, e.g. the process backend).
func ReadMemory(pid int, guestBytes int64) (Memory, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, fmt.Errorf("reading the memory of process %d: %w", pid, err)
	}
	m, err := ParseStatus(status)
	if err != nil {
		return Memory{}, err
	}
	m.VMMKiB = m.RSSKiB
	if guestBytes <= 0 {
		m.Separated = true // no guest RAM in this process
		return m, nil
	}
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return m, fmt.Errorf("reading the mappings of process %d: %w", pid, err)
	}
	maps, err := ParseSmaps(smaps)
	if err != nil {
		return m, err
	}
	if g, ok := GuestMapping(maps, guestBytes); ok {
		m.GuestKiB = g.RSSKiB
		m.VMMKiB = max(0, m.RSSKiB-g.RSSKiB)
		m.Separated = true
	}
	return m, nil
}

// ParseStatus reads VmRSS and VmHWM from /proc/PID/status text.
func ParseStatus(text []byte) (Memory, error) {
	var m Memory
	var haveRSS bool
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch key {
		case "VmRSS", "VmHWM":
			kib, err := parseKiB(val)
			if err != nil {
				return Memory{}, fmt.Errorf("/proc status %s: %w", key, err)
			}
			if key == "VmRSS" {
				m.RSSKiB, haveRSS = kib, true
			} else {
				m.HWMKiB = kib
			}
		}
	}
	if !haveRSS {
		return Memory{}, fmt.Errorf("/proc status has no VmRSS line (a kernel thread, or a process that ended)")
	}
	return m, nil
}

// Rollup is /proc/PID/smaps_rollup's totals, in KiB.
type Rollup struct {
	RSSKiB, PSSKiB, AnonKiB int64
}

// ParseSmapsRollup reads Rss, Pss and Anonymous from smaps_rollup text.
func ParseSmapsRollup(text []byte) (Rollup, error) {
	var r Rollup
	var have bool
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch key {
		case "Rss":
			dst, have = &r.RSSKiB, true
		case "Pss":
			dst = &r.PSSKiB
		case "Anonymous":
			dst = &r.AnonKiB
		default:
			continue
		}
		kib, err := parseKiB(val)
		if err != nil {
			return Rollup{}, fmt.Errorf("smaps_rollup %s: %w", key, err)
		}
		*dst = kib
	}
	if !have {
		return Rollup{}, fmt.Errorf("smaps_rollup has no Rss line")
	}
	return r, nil
}

// Mapping is one /proc/PID/smaps entry.
type Mapping struct {
	Start, End uint64
	Path       string // empty for an anonymous mapping
	SizeKiB    int64
	RSSKiB     int64
}

// Anonymous reports whether the mapping has no backing file.
func (m Mapping) Anonymous() bool { return m.Path == "" }

// ParseSmaps parses /proc/PID/smaps text into its mappings.
func ParseSmaps(text []byte) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if header, ok := parseMapsHeader(line); ok {
			out = append(out, header)
			continue
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok || len(out) == 0 {
			continue
		}
		var dst *int64
		switch key {
		case "Size":
			dst = &out[len(out)-1].SizeKiB
		case "Rss":
			dst = &out[len(out)-1].RSSKiB
		default:
			continue
		}
		kib, err := parseKiB(val)
		if err != nil {
			return nil, fmt.Errorf("smaps %s of mapping %x: %w", key, out[len(out)-1].Start, err)
		}
		*dst = kib
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading smaps: %w", err)
	}
	return out, nil
}

// parseMapsHeader parses "start-end perms offset dev inode [path]".
func parseMapsHeader(line string) (Mapping, bool) {
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return Mapping{}, false
	}
	lo, hi, ok := strings.Cut(fields[0], "-")
	if !ok {
		return Mapping{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || end < start || len(fields[1]) != 4 {
		return Mapping{}, false
	}
	m := Mapping{Start: start, End: end}
	if len(fields) >= 6 {
		m.Path = strings.Join(fields[5:], " ")
	}
	return m, true
}

// GuestMapping finds the guest-RAM mapping: the smallest anonymous mapping
// at least guestBytes long and at most 2 MiB longer (qemu adds a guard
// page or alignment; our VMM maps each RAM region exactly). A guest whose
// RAM is split in several regions (above 3 GiB) is not found.
func GuestMapping(maps []Mapping, guestBytes int64) (Mapping, bool) {
	want := guestBytes / 1024
	var best Mapping
	found := false
	for _, m := range maps {
		if !m.Anonymous() || m.SizeKiB < want || m.SizeKiB > want+2048 {
			continue
		}
		if !found || m.SizeKiB < best.SizeKiB {
			best, found = m, true
		}
	}
	return best, found
}

func parseKiB(val string) (int64, error) {
	f := strings.Fields(val)
	if len(f) == 0 || len(f) > 2 || (len(f) == 2 && f[1] != "kB") {
		return 0, fmt.Errorf("want \"N kB\", got %q", strings.TrimSpace(val))
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("want \"N kB\", got %q", strings.TrimSpace(val))
	}
	return n, nil
}
