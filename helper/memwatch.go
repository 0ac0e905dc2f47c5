package helper

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Host memory: the helper takes memory back from idle guests when the
// host runs short (issue #44).
//
// Every MemoryPoll the helper reads the host's MemAvailable. Below
// shortShare of MemTotal the host is short: every running guest with no
// process (idle) that can give memory back (MemoryReclaimer: the VM's
// balloon) is asked to, idle guests only, so that no session slows down.
// Above roomShare the host has room again and every guest asked is let
// have its memory back; so is one whose session starts a process (spawn),
// at once. The two thresholds differ so that a host near one of them does
// not make the balloons swing.

// MemInfoEnv names a file the helper reads instead of /proc/meminfo
// (Options.MemInfo): tests make the host look short of memory with it.
// Never set it in production.
const MemInfoEnv = "COWORK_VMM_MEMINFO"

// MemoryReclaimer may be implemented by a Guest that can give memory back
// to the host while it runs (the VM's virtio-balloon): Reclaim asks the
// guest for what it can spare now, Release lets it have it all again.
// Neither blocks for long; both may be called again.
type MemoryReclaimer interface {
	Reclaim()
	Release()
}

const (
	// defaultMemoryPoll is how often the host's memory is read.
	defaultMemoryPoll = 5 * time.Second
	// shortShare and roomShare, in hundredths of MemTotal: below the one
	// the host is short, above the other it has room again.
	shortShare = 10
	roomShare  = 20
)

// hostMemory is what the watch reads: the host's available and total
// memory, in KiB.
type hostMemory struct{ availableKiB, totalKiB uint64 }

// readHostMemory parses MemAvailable and MemTotal out of a meminfo file.
func readHostMemory(path string) (hostMemory, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return hostMemory{}, err
	}
	var m hostMemory
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		var dst *uint64
		switch string(f[0]) {
		case "MemAvailable:":
			dst = &m.availableKiB
		case "MemTotal:":
			dst = &m.totalKiB
		default:
			continue
		}
		if *dst, err = strconv.ParseUint(string(f[1]), 10, 64); err != nil {
			return hostMemory{}, fmt.Errorf("%s: %s: %w", path, f[0], err)
		}
	}
	if m.totalKiB == 0 {
		return hostMemory{}, fmt.Errorf("%s: no MemTotal", path)
	}
	return m, nil
}

func (m hostMemory) short() bool { return m.availableKiB*100 < m.totalKiB*shortShare }
func (m hostMemory) roomy() bool { return m.availableKiB*100 > m.totalKiB*roomShare }

// watchMemory runs the watch until stop is closed.
func (h *Helper) watchMemory(stop <-chan struct{}) {
	tick := time.NewTicker(h.opts.MemoryPoll)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			m, err := readHostMemory(h.opts.MemInfo)
			if err != nil {
				h.log.Debug("reading the host's memory", "err", err)
				continue
			}
			h.balanceMemory(m)
		}
	}
}

// balanceMemory asks idle guests for memory when the host is short and
// lets them have it back when it has room.
func (h *Helper) balanceMemory(m hostMemory) {
	h.mu.Lock()
	services := make([]*Service, 0, len(h.services))
	for _, s := range h.services {
		services = append(services, s)
	}
	h.mu.Unlock()
	for _, s := range services {
		s.mu.Lock()
		inst, idle := s.guest, s.procs.running() == 0
		s.mu.Unlock()
		if inst == nil || !inst.connected.Load() {
			continue
		}
		switch {
		case m.short() && idle:
			inst.reclaimMemory(m)
		case m.roomy():
			inst.releaseMemory()
		}
	}
}

// reclaimMemory asks the guest for memory, once per short spell.
func (inst *guestInstance) reclaimMemory(m hostMemory) {
	r, ok := inst.guest.(MemoryReclaimer)
	if !ok || inst.reclaimed.Swap(true) {
		return
	}
	inst.s.log.Info("host memory is short: asking the idle guest for memory back",
		"availableMiB", m.availableKiB>>10, "totalMiB", m.totalKiB>>10)
	r.Reclaim()
}

// releaseMemory lets a guest asked for memory have it back.
func (inst *guestInstance) releaseMemory() {
	r, ok := inst.guest.(MemoryReclaimer)
	if !ok || !inst.reclaimed.Swap(false) {
		return
	}
	inst.s.log.Info("the guest has its memory back")
	r.Release()
}
