package x86

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSetLAPICLINTs(t *testing.T) {
	regs := make([]byte, LAPICRegsSize)
	le := binary.LittleEndian
	le.PutUint32(regs[0x350:], 0x00010200|0x30) // masked, vector 0x30, SMI mode
	le.PutUint32(regs[0x360:], 0x00010000)
	require.NoError(t, SetLAPICLINTs(regs))
	require.Equal(t, uint32(0x00010730), le.Uint32(regs[0x350:]), "LINT0 ExtINT, other bits kept")
	require.Equal(t, uint32(0x00010400), le.Uint32(regs[0x360:]), "LINT1 NMI")
	require.Error(t, SetLAPICLINTs(make([]byte, 100)))
}
