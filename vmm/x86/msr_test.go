package x86

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBootMSRs(t *testing.T) {
	got := map[uint32]uint64{}
	for _, m := range BootMSRs() {
		_, dup := got[m.Index]
		require.False(t, dup, "MSR %#x listed twice", m.Index)
		got[m.Index] = m.Value
	}
	want := map[uint32]uint64{
		0x174: 0, 0x175: 0, 0x176: 0, // SYSENTER_CS/ESP/EIP
		0xc0000081: 0, 0xc0000082: 0, 0xc0000083: 0, 0xc0000084: 0, // STAR, LSTAR, CSTAR, SFMASK
		0xc0000102: 0,     // KERNEL_GS_BASE
		0x10:       0,     // TSC
		0x1a0:      1,     // MISC_ENABLE: fast strings
		0x2ff:      0x806, // MTRRdefType: enabled, write-back
	}
	require.Equal(t, want, got)
}
