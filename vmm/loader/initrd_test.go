package loader

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

func TestLoadInitrdPlacement(t *testing.T) {
	const mib, gib = uint64(1 << 20), uint64(1 << 30)
	tests := []struct {
		name                    string
		mem, kernelEnd, maxAddr uint64
		size                    int
		want                    uint64
	}{
		{"top of small RAM", 256 * mib, 0x1205000, 0x7fffffff, 0x1800, 256*mib - 0x2000},
		{"page-aligned exact", 256 * mib, 0x1205000, 0x7fffffff, 0x1000, 256*mib - 0x1000},
		{"default max", 256 * mib, 0x1205000, 0, 0x1000, 256*mib - 0x1000},
		{"capped by initrd_addr_max", 8 * gib, 0x1205000, 0x7fffffff, 0x1000, 0x80000000 - 0x1000},
		{"capped by the hole", 8 * gib, 0x1205000, 0xffffffff, 0x1000, x86.MMIOHoleStart - 0x1000},
		{"fits right after the kernel", 32 * mib, 0x1205000, 0x7fffffff, int(32*mib - 0x1205000), 0x1205000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := newSparseMemory(tc.mem)
			data := pattern(tc.size, 4)
			addr, err := LoadInitrd(mem, data, tc.mem, tc.kernelEnd, tc.maxAddr)
			require.NoError(t, err)
			require.Equal(t, tc.want, addr)
			require.Zero(t, addr%x86.InitrdAlign)
			require.GreaterOrEqual(t, addr, tc.kernelEnd)
			require.Equal(t, data, mem.read(addr, len(data)))
		})
	}
}

func TestLoadInitrdRejects(t *testing.T) {
	const mem = 32 << 20
	tests := map[string]struct {
		size                     int
		memBytes, kernelEnd, max uint64
		want                     error
	}{
		"empty":                {0, mem, 0x1100000, 0, ErrNoRoom},
		"overlaps kernel":      {mem - 0x1100000 + 1, mem, 0x1100000, 0, ErrNoRoom},
		"larger than RAM":      {mem + 1, mem, 0x1100000, 0, ErrNoRoom},
		"kernel ends past RAM": {0x1000, mem, mem + 0x1000, 0, ErrNoRoom},
		"kernel end overflow":  {0x1000, mem, ^uint64(0) - 5, 0, ErrNoRoom},
		"below max too small":  {0x2000, mem, 0x1100000, 0x1100fff, ErrNoRoom},
		"bad memory size":      {0x1000, 12345, 0x1100000, 0, x86.ErrBadMemorySize},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := newSparseMemory(mem)
			_, err := LoadInitrd(m, make([]byte, tc.size), tc.memBytes, tc.kernelEnd, tc.max)
			require.ErrorIs(t, err, tc.want)
			require.Zero(t, m.writes)
		})
	}
}

func TestWriteCmdline(t *testing.T) {
	mem := newSparseMemory(testMem)
	n, err := WriteCmdline(mem, "console=ttyS0 quiet", 0)
	require.NoError(t, err)
	require.Equal(t, 19, n)
	require.Equal(t, []byte("console=ttyS0 quiet\x00"), mem.read(x86.CmdlineAddr, 20))

	long := make([]byte, 2047)
	for i := range long {
		long[i] = 'a'
	}
	_, err = WriteCmdline(mem, string(long), 2048)
	require.NoError(t, err, "2047 bytes + NUL fit in 2048")
	_, err = WriteCmdline(mem, string(long)+"b", 2048)
	require.ErrorIs(t, err, ErrBadCmdline)
	_, err = WriteCmdline(mem, "a\x00b", 0)
	require.ErrorIs(t, err, ErrBadCmdline)
	_, err = WriteCmdline(mem, string(make([]byte, 1<<20)), 1<<30)
	require.ErrorIs(t, err, ErrBadCmdline, "capped by the room before the EBDA")
	n, err = WriteCmdline(mem, "", 0)
	require.NoError(t, err)
	require.Zero(t, n)
}

// streamedInitrd writes its data through a GuestStream, as the VMM's
// initramfs does; grow adds bytes beyond what Size announced (a host file
// that grew while being archived).
type streamedInitrd struct {
	data []byte
	grow int
}

func (s streamedInitrd) Size() uint64 { return uint64(len(s.data)) }

func (s streamedInitrd) WriteTo(mem x86.GuestWriter, addr uint64) error {
	w := NewGuestStream(mem, addr, s.Size())
	if _, err := w.Write(s.data[:len(s.data)/2]); err != nil {
		return err
	}
	_, err := w.Write(append(s.data[len(s.data)/2:], make([]byte, s.grow)...))
	return err
}

func TestLoadInitrdFromStreamsIntoPlace(t *testing.T) {
	const mem = 32 << 20
	m := newSparseMemory(mem)
	data := pattern(0x1801, 7)
	addr, err := LoadInitrdFrom(m, streamedInitrd{data: data}, mem, 0x1100000, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(mem-0x2000), addr)
	require.Equal(t, data, m.read(addr, len(data)))
}

func TestGuestStreamRefusesToOverrunItsReservation(t *testing.T) {
	const mem = 32 << 20
	m := newSparseMemory(mem)
	_, err := LoadInitrdFrom(m, streamedInitrd{data: pattern(0x1000, 3), grow: 1}, mem, 0x1100000, 0)
	require.ErrorIs(t, err, ErrStreamFull)
	w := NewGuestStream(m, mem-0x1000, 0x1000)
	n, err := w.Write(make([]byte, 0x1001))
	require.ErrorIs(t, err, ErrStreamFull)
	require.Zero(t, n)
	require.Zero(t, w.Written())
}

func TestWriteStreamWantsExactlyItsSize(t *testing.T) {
	const mem = 32 << 20
	m := newSparseMemory(mem)
	data := pattern(0x1000, 5)
	write := func(p []byte) func(io.Writer) error {
		return func(w io.Writer) error { _, err := w.Write(p); return err }
	}
	require.NoError(t, WriteStream(m, 0x100000, 0x1000, write(data)))
	require.Equal(t, data, m.read(0x100000, 0x1000))
	require.ErrorIs(t, WriteStream(m, 0x100000, 0x1000, write(data[:0xfff])), ErrStreamShort)
	require.ErrorIs(t, WriteStream(m, 0x100000, 0xfff, write(data)), ErrStreamFull)
}
