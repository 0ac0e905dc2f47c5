package machine

import "testing"

func TestVirtioGSIsAvoidLegacyLines(t *testing.T) {
	seen := map[uint32]bool{}
	for _, g := range virtioGSIs {
		switch g {
		case 0, 1, 2, 3, 4, 8, 13:
			t.Errorf("GSI %d belongs to a legacy device", g)
		}
		if g > 23 || seen[g] {
			t.Errorf("GSI %d out of the IOAPIC's range or repeated", g)
		}
		seen[g] = true
	}
}

// defaultCmdlineWords are words the x86 DefaultCmdline must hold.
var defaultCmdlineWords = []string{"console=ttyS0", "reboot=k", "panic=-1", "i8042.noaux", "i8042.nokbd", "initcall_blacklist=cmos_init"}
