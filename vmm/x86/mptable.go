package x86

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The Intel MultiProcessor Specification 1.4 tables, which tell the guest
// about its CPUs and interrupt routing without ACPI. Linux finds the
// 16-byte floating pointer ("_MP_") by scanning the last KiB of base memory;
// it points at the configuration table ("PCMP"): a header and then
// entries, processors first.
const (
	mpFloatingPointerSize = 16
	mpConfigHeaderSize    = 44
	mpProcessorEntrySize  = 20
	mpOtherEntrySize      = 8 // bus, IOAPIC, I/O and local interrupt entries

	mpEntryProcessor = 0
	mpEntryBus       = 1
	mpEntryIOAPIC    = 2
	mpEntryIOIntr    = 3
	mpEntryLocalIntr = 4

	mpSpecRevision = 4    // MP spec 1.4
	mpLAPICVersion = 0x14 // integrated APIC, as KVM's LAPIC reports
	mpIOAPICVer    = 0x11 // KVM's IOAPIC version register
	mpCPUEnabled   = 1 << 0
	mpCPUBoot      = 1 << 1
	mpCPUSignature = 0x600          // family 6
	mpCPUFeatures  = 1<<9 | 1<<0    // APIC | FPU
	mpIOAPICUsable = 1              // IOAPIC flags: enabled
	mpIntINT       = 0              // vectored interrupt
	mpIntNMI       = 1              // NMI
	mpIntExtINT    = 3              // 8259-compatible external interrupt
	mpLocalAllAPIC = 0xff           // local interrupt destination: every LAPIC
	mpBusISA       = 0              // our one bus's ID
	mpOEMID        = "COWORK  "     // 8 bytes
	mpProductID    = "COWORK-VMM  " // 12 bytes
)

// MPTableSize returns the size of MPTable(cpus)'s output.
func MPTableSize(cpus int) int {
	return mpFloatingPointerSize + mpConfigHeaderSize + cpus*mpProcessorEntrySize +
		(1+1+IOAPICPins+2)*mpOtherEntrySize
}

// ErrBadCPUCount is returned for a vCPU count outside 1..MaxCPUs.
var ErrBadCPUCount = errors.New("bad vCPU count")

// MPTable returns the MP floating pointer followed by the configuration
// table, built to be written at MPTableAddr (the pointer holds absolute
// addresses). It lists:
//   - one processor per vCPU, APIC ID i for vCPU i, vCPU 0 the boot CPU;
//   - one ISA bus (ID 0);
//   - the IOAPIC, ID cpus (the first ID after the LAPICs), at IOAPICAddr;
//   - ISA IRQ i routed to IOAPIC pin i for i in 0..IOAPICPins-1, with the
//     bus's default polarity and trigger (edge, active high): devices
//     signal by an edge, e.g. KVM_IRQFD;
//   - LINT0 of every LAPIC as ExtINT (the 8259) and LINT1 as NMI.
//
// cpus must be 1..MaxCPUs: APIC IDs and the IOAPIC ID share 8 bits, 0xff is
// broadcast.
func MPTable(cpus int) ([]byte, error) {
	if cpus < 1 || cpus > MaxCPUs {
		return nil, fmt.Errorf("%w: %d vCPUs, the MP table holds 1..%d", ErrBadCPUCount, cpus, MaxCPUs)
	}
	size := MPTableSize(cpus)
	if uint64(size) > MPTableMaxSize {
		return nil, fmt.Errorf("%w: MP table of %d bytes exceeds %d", ErrBadCPUCount, size, MPTableMaxSize)
	}
	le := binary.LittleEndian
	buf := make([]byte, size)

	// Floating pointer.
	fp := buf[:mpFloatingPointerSize]
	copy(fp, "_MP_")
	le.PutUint32(fp[4:], uint32(MPTableAddr)+mpFloatingPointerSize)
	fp[8] = 1 // length in 16-byte units
	fp[9] = mpSpecRevision
	// fp[11] feature byte 1 = 0: a configuration table is present.
	fp[10] = checksum(fp)

	// Entries, after the header.
	cfg := buf[mpFloatingPointerSize:]
	off := mpConfigHeaderSize
	entries := 0
	ioapicID := uint8(cpus)
	for i := range cpus {
		e := cfg[off : off+mpProcessorEntrySize]
		e[0] = mpEntryProcessor
		e[1] = uint8(i)
		e[2] = mpLAPICVersion
		e[3] = mpCPUEnabled
		if i == 0 {
			e[3] |= mpCPUBoot
		}
		le.PutUint32(e[4:], mpCPUSignature)
		le.PutUint32(e[8:], mpCPUFeatures)
		off += mpProcessorEntrySize
		entries++
	}
	next := func() []byte {
		e := cfg[off : off+mpOtherEntrySize]
		off += mpOtherEntrySize
		entries++
		return e
	}
	bus := next()
	bus[0] = mpEntryBus
	bus[1] = mpBusISA
	copy(bus[2:], "ISA   ")
	io := next()
	io[0] = mpEntryIOAPIC
	io[1] = ioapicID
	io[2] = mpIOAPICVer
	io[3] = mpIOAPICUsable
	le.PutUint32(io[4:], uint32(IOAPICAddr))
	for irq := range IOAPICPins {
		e := next()
		e[0] = mpEntryIOIntr
		e[1] = mpIntINT
		// e[2:4] flags 0: polarity and trigger conform to the bus.
		e[4] = mpBusISA
		e[5] = uint8(irq)
		e[6] = ioapicID
		e[7] = uint8(irq)
	}
	for lint, typ := range []uint8{mpIntExtINT, mpIntNMI} {
		e := next()
		e[0] = mpEntryLocalIntr
		e[1] = typ
		e[4] = mpBusISA
		e[5] = 0
		e[6] = mpLocalAllAPIC
		e[7] = uint8(lint)
	}

	// Header.
	h := cfg[:mpConfigHeaderSize]
	copy(h, "PCMP")
	le.PutUint16(h[4:], uint16(off))
	h[6] = mpSpecRevision
	copy(h[8:16], mpOEMID)
	copy(h[16:28], mpProductID)
	le.PutUint16(h[34:], uint16(entries))
	le.PutUint32(h[36:], uint32(LAPICAddr))
	h[7] = checksum(cfg[:off])
	return buf, nil
}

// checksum returns the byte that makes b sum to zero (mod 256), b's
// checksum byte being zero when called.
func checksum(b []byte) uint8 {
	var sum uint8
	for _, c := range b {
		sum += c
	}
	return -sum
}
