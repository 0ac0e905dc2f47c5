package vmm

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// TestSameCPUID: a state restores only into a vCPU given the CPUID table
// it ran with; another table (a host without AVX-512, another policy) or
// none recorded (an older snapshot) is a snapshot mismatch, not damage.
func TestSameCPUID(t *testing.T) {
	table := []kvm.CPUIDEntry{
		{Function: 1, ECX: 1<<28 | 1<<26, EDX: 1},
		{Function: 7, EBX: 1 << 16}, // AVX-512F
		{Function: 0xd, EAX: 0xe7, ECX: 0xa88},
	}
	require.NoError(t, sameCPUID(0, table, append([]kvm.CPUIDEntry(nil), table...)))

	noAVX512 := append([]kvm.CPUIDEntry(nil), table...)
	noAVX512[1].EBX = 0
	for name, c := range map[string]struct {
		saved, now []kvm.CPUIDEntry
		says       string
	}{
		"another feature set": {table, noAVX512, "leaf 0x7.0 eax=0x0 ebx=0x10000"},
		"fewer entries":       {table, table[:2], "3 CPUID entries, this VM offers 2"},
		"none recorded":       {nil, table, "records no CPUID"},
	} {
		t.Run(name, func(t *testing.T) {
			err := sameCPUID(1, c.saved, c.now)
			require.ErrorContains(t, err, c.says)
			require.True(t, errors.Is(err, snapshot.ErrMismatch), "a mismatch: the caller boots cold")
		})
	}
}
