package x86

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

type mpProcessor struct {
	apicID uint8
	flags  uint8
}

type mpIntr struct {
	typ, irqType, bus, srcIRQ, dstAPIC, dstPin uint8
}

type parsedMP struct {
	processors []mpProcessor
	buses      []string
	ioapicID   uint8
	ioapicAddr uint32
	intrs      []mpIntr
}

func sum(b []byte) uint8 {
	var s uint8
	for _, c := range b {
		s += c
	}
	return s
}

// parseMP reads the tables back as Linux's mpparse.c does (written at
// MPTableAddr), failing on anything Linux would reject.
func parseMP(t *testing.T, b []byte) parsedMP {
	t.Helper()
	le := binary.LittleEndian
	require.GreaterOrEqual(t, len(b), 16)
	fp := b[:16]
	require.Equal(t, "_MP_", string(fp[:4]))
	require.Equal(t, uint8(1), fp[8], "floating pointer length")
	require.Equal(t, uint8(4), fp[9], "spec 1.4")
	require.Zero(t, sum(fp), "floating pointer checksum")
	require.Zero(t, fp[11], "feature byte 1: table present, no default config")
	require.Zero(t, MPTableAddr%16, "floating pointer must be 16-byte aligned")
	phys := uint64(le.Uint32(fp[4:]))
	require.GreaterOrEqual(t, phys, MPTableAddr)
	off := phys - MPTableAddr
	cfg := b[off:]
	require.Equal(t, "PCMP", string(cfg[:4]))
	length := int(le.Uint16(cfg[4:]))
	require.LessOrEqual(t, length, len(cfg))
	cfg = cfg[:length]
	require.Equal(t, uint8(4), cfg[6])
	require.Zero(t, sum(cfg), "config table checksum")
	require.Equal(t, uint32(LAPICAddr), le.Uint32(cfg[36:]))
	count := int(le.Uint16(cfg[34:]))

	var p parsedMP
	rest := cfg[44:]
	for i := range count {
		require.NotEmpty(t, rest, "entry %d missing", i)
		switch rest[0] {
		case 0:
			require.GreaterOrEqual(t, len(rest), 20)
			p.processors = append(p.processors, mpProcessor{apicID: rest[1], flags: rest[3]})
			rest = rest[20:]
			continue
		case 1:
			p.buses = append(p.buses, string(rest[2:8]))
		case 2:
			p.ioapicID = rest[1]
			require.Equal(t, uint8(1), rest[3], "IOAPIC enabled")
			p.ioapicAddr = le.Uint32(rest[4:])
		case 3, 4:
			p.intrs = append(p.intrs, mpIntr{rest[0], rest[1], rest[4], rest[5], rest[6], rest[7]})
		default:
			t.Fatalf("unknown entry type %d", rest[0])
		}
		rest = rest[8:]
	}
	require.Empty(t, rest, "bytes after the last entry")
	return p
}

func TestMPTable(t *testing.T) {
	for _, cpus := range []int{1, 2, 4, MaxCPUs} {
		t.Run(fmt.Sprint(cpus), func(t *testing.T) {
			b, err := MPTable(cpus)
			require.NoError(t, err)
			require.Len(t, b, MPTableSize(cpus))
			require.LessOrEqual(t, uint64(len(b)), MPTableMaxSize)
			p := parseMP(t, b)
			require.Len(t, p.processors, cpus)
			for i, pr := range p.processors {
				require.Equal(t, uint8(i), pr.apicID)
				want := uint8(mpCPUEnabled)
				if i == 0 {
					want |= mpCPUBoot
				}
				require.Equal(t, want, pr.flags, "cpu %d", i)
			}
			require.Equal(t, []string{"ISA   "}, p.buses)
			require.Equal(t, uint8(cpus), p.ioapicID, "IOAPIC ID after the LAPIC IDs")
			require.Equal(t, uint32(IOAPICAddr), p.ioapicAddr)
			require.Len(t, p.intrs, IOAPICPins+2)
			for irq := range IOAPICPins {
				require.Equal(t, mpIntr{3, mpIntINT, 0, uint8(irq), uint8(cpus), uint8(irq)}, p.intrs[irq])
			}
			require.Equal(t, mpIntr{4, mpIntExtINT, 0, 0, 0xff, 0}, p.intrs[IOAPICPins])
			require.Equal(t, mpIntr{4, mpIntNMI, 0, 0, 0xff, 1}, p.intrs[IOAPICPins+1])
		})
	}
}

func TestMPTableRejects(t *testing.T) {
	for _, cpus := range []int{-1, 0, MaxCPUs + 1, 1000} {
		_, err := MPTable(cpus)
		require.ErrorIs(t, err, ErrBadCPUCount, "cpus %d", cpus)
	}
}
