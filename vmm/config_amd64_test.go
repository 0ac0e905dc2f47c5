package vmm

import (
	"strings"
	"testing"
)

// TestNewRefusesBadConfigsBeforeOpeningKVM: New checks the sizes before it
// touches KVM (DevicePath names nothing here), so each error is the
// config's, on any host.
func TestNewRefusesBadConfigsBeforeOpeningKVM(t *testing.T) {
	const mem = 64 << 20
	missing := t.TempDir() + "/no-kvm"
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{CPUs: 0, MemoryBytes: mem}, "0 vCPUs requested"},
		{Config{CPUs: MaxVCPUs + 1, MemoryBytes: mem}, "vCPUs requested, must be 1.."},
		{Config{CPUs: 1}, "memory size 0"},
		{Config{CPUs: 1, MemoryBytes: mem + 1}, "multiple of 4 KiB"},
		{Config{CPUs: 1, MemoryBytes: mem, MMIOHoleStart: DefaultMMIOHoleStart + 1}, "MMIO hole start"},
		{Config{CPUs: 1, MemoryBytes: mem, MMIOHoleStart: TSSAddr + pageSize}, "MMIO hole start"},
	} {
		c.cfg.DevicePath = missing
		_, err := New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
	hole, err := Config{CPUs: 1, MemoryBytes: mem}.check()
	if err != nil || hole != DefaultMMIOHoleStart {
		t.Errorf("check() = %#x, %v; want the default hole %#x", hole, err, DefaultMMIOHoleStart)
	}
	if _, err := New(Config{CPUs: 1, MemoryBytes: mem, DevicePath: missing}); err == nil || strings.Contains(err.Error(), "vmm: ") {
		t.Errorf("a good config gets as far as opening %s: %v", missing, err)
	}
}
