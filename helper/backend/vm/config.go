package vm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"github.com/cowork-vmm/cowork-vmm/vmm"
)

// Sizing defaults and limits. The helper passes the client's memoryGB and
// cpuCount (or its own defaults); zero means "ours".
const (
	DefaultMemoryMiB = 2048
	DefaultCPUs      = 2
	// MinMemoryMiB keeps a guest bootable: the kernel, the initramfs (the
	// helper's executable) unpacked in RAM, and room for the tools it runs.
	MinMemoryMiB = 256
	// hostMemoryShare is the most of the host's RAM one guest may have, in
	// quarters: guest RAM is faulted in lazily, but the host must keep room.
	hostMemoryShare = 3
)

// hostLimits is what sizing is capped at.
type hostLimits struct {
	memoryMiB int // 0: unknown, no cap
	cpus      int
}

// currentHostLimits reads the host's memory and CPU count.
func currentHostLimits() hostLimits {
	l := hostLimits{cpus: runtime.NumCPU()}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		l.memoryMiB = memTotalMiB(data)
	}
	return l
}

// memTotalMiB parses MemTotal out of /proc/meminfo; 0 if absent.
func memTotalMiB(meminfo []byte) int {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) >= 2 && string(fields[0]) == "MemTotal:" {
			kib, err := strconv.ParseUint(string(fields[1]), 10, 64)
			if err != nil || kib>>10 > 1<<40 {
				return 0
			}
			return int(kib >> 10)
		}
	}
	return 0
}

// sizing turns the requested memory (MiB) and CPUs into what the VM gets:
// zero takes the default, values are capped at the host's limits (a
// quarter of its RAM stays with the host; no more vCPUs than host CPUs)
// and negative or too-small values are refused.
func sizing(memoryMiB, cpus int, host hostLimits) (int, int, error) {
	if memoryMiB < 0 || cpus < 0 {
		return 0, 0, fmt.Errorf("kvm backend: memory %d MiB and %d CPUs: sizes cannot be negative", memoryMiB, cpus)
	}
	if memoryMiB == 0 {
		memoryMiB = DefaultMemoryMiB
	}
	if cpus == 0 {
		cpus = DefaultCPUs
	}
	if host.memoryMiB > 0 {
		memoryMiB = min(memoryMiB, host.memoryMiB*hostMemoryShare/4)
	}
	if memoryMiB < MinMemoryMiB {
		return 0, 0, fmt.Errorf("kvm backend: %d MiB of guest memory is too little (the host has %d MiB): a guest needs at least %d MiB",
			memoryMiB, host.memoryMiB, MinMemoryMiB)
	}
	if host.cpus > 0 {
		cpus = min(cpus, host.cpus)
	}
	cpus = min(cpus, vmm.MaxVCPUs)
	return memoryMiB, cpus, nil
}
