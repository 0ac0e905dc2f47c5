package vm

import (
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm"
)

func TestMemTotalMiB(t *testing.T) {
	meminfo := []byte("MemFree:  1000 kB\nMemTotal:       24576000 kB\nBuffers: 1 kB\n")
	if got := memTotalMiB(meminfo); got != 24000 {
		t.Errorf("memTotalMiB = %d, want 24000", got)
	}
	for _, bad := range []string{"", "MemTotal: lots kB\n", "MemFree: 5 kB\n", "MemTotal:\n"} {
		if got := memTotalMiB([]byte(bad)); got != 0 {
			t.Errorf("memTotalMiB(%q) = %d, want 0", bad, got)
		}
	}
}

func TestSizing(t *testing.T) {
	big := hostLimits{memoryMiB: 24000, cpus: 2}
	for _, tc := range []struct {
		name           string
		mem, cpus      int
		host           hostLimits
		wantMem, wantC int
	}{
		{"defaults", 0, 0, big, DefaultMemoryMiB, DefaultCPUs},
		{"asked", 4096, 1, big, 4096, 1},
		{"memory capped at three quarters of the host", 100000, 1, big, 18000, 1},
		{"cpus capped at the host's", 1024, 16, big, 1024, 2},
		{"unknown host memory: no cap", 100000, 1, hostLimits{cpus: 4}, 100000, 1},
		{"small host", 0, 0, hostLimits{memoryMiB: 2000, cpus: 1}, 1500, 1},
		{"vCPUs capped at the VMM's limit", 1024, 100000, hostLimits{cpus: 100000}, 1024, vmm.MaxVCPUs},
	} {
		mem, cpus, err := sizing(tc.mem, tc.cpus, tc.host)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if mem != tc.wantMem || cpus != tc.wantC {
			t.Errorf("%s: sizing(%d, %d) = %d MiB, %d CPUs; want %d, %d", tc.name, tc.mem, tc.cpus, mem, cpus, tc.wantMem, tc.wantC)
		}
	}
}

func TestSizingRefuses(t *testing.T) {
	if _, _, err := sizing(-1, 1, hostLimits{}); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("negative memory: %v", err)
	}
	if _, _, err := sizing(128, 1, hostLimits{cpus: 2}); err == nil || !strings.Contains(err.Error(), "at least 256 MiB") {
		t.Errorf("128 MiB: %v", err)
	}
	// A host so small that three quarters of it is below the minimum.
	if _, _, err := sizing(0, 0, hostLimits{memoryMiB: 300, cpus: 1}); err == nil || !strings.Contains(err.Error(), "too little") {
		t.Errorf("tiny host: %v", err)
	}
}
