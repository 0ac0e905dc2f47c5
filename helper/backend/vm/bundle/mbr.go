package bundle

import (
	"encoding/binary"
	"fmt"
)

// MBR layout: four 16-byte entries at byte 446, the signature 0x55 0xAA at
// byte 510.
const (
	mbrEntriesOffset = 446
	mbrEntrySize     = 16
	mbrEntries       = 4
	mbrTypeGPT       = 0xEE
)

// mbrExtendedTypes are the MBR system ids of extended partitions, whose
// logical partitions this package does not follow.
var mbrExtendedTypes = map[byte]bool{0x05: true, 0x0F: true, 0x85: true}

type mbrEntry struct {
	slot        int
	systemID    byte
	startLBA    uint32
	sectorCount uint32
}

type mbrSector struct {
	// valid: the 0x55AA signature and every boot indicator 0x00 or 0x80
	// (the test Linux uses to tell an MBR from a boot sector's code).
	valid bool
	// protective: an entry of type 0xEE, so the disk is GPT.
	protective bool
	entries    []mbrEntry
}

func parseMBR(sector []byte) mbrSector {
	var m mbrSector
	if sector[510] != 0x55 || sector[511] != 0xAA {
		return m
	}
	for slot := range mbrEntries {
		e := sector[mbrEntriesOffset+slot*mbrEntrySize:][:mbrEntrySize]
		if e[0] != 0x00 && e[0] != 0x80 {
			return mbrSector{}
		}
		entry := mbrEntry{
			slot:        slot + 1,
			systemID:    e[4],
			startLBA:    binary.LittleEndian.Uint32(e[8:12]),
			sectorCount: binary.LittleEndian.Uint32(e[12:16]),
		}
		if entry.systemID == 0 {
			continue
		}
		if entry.systemID == mbrTypeGPT {
			m.protective = true
		}
		m.entries = append(m.entries, entry)
	}
	m.valid = true
	return m
}

// mbrTable turns a valid, non-protective MBR into a Table, checking each
// entry against the image's size.
func mbrTable(m mbrSector, size int64) (Table, error) {
	t := Table{Kind: TableMBR}
	for _, e := range m.entries {
		if mbrExtendedTypes[e.systemID] {
			t.Notes = append(t.Notes, fmt.Sprintf("MBR partition %d is extended (type 0x%02x); its logical partitions are not read", e.slot, e.systemID))
			continue
		}
		start := int64(e.startLBA) * SectorSize
		length := int64(e.sectorCount) * SectorSize
		switch {
		case e.startLBA == 0 || e.sectorCount == 0:
			return Table{}, fmt.Errorf("MBR partition %d: starts at LBA %d with %d sectors", e.slot, e.startLBA, e.sectorCount)
		case start+length > size:
			return Table{}, fmt.Errorf("MBR partition %d: ends at byte %d, past the image's end at %d (truncated?)", e.slot, start+length, size)
		}
		t.Partitions = append(t.Partitions, Partition{Number: e.slot, Start: start, Length: length, MBRType: e.systemID})
	}
	if err := checkPartitions(t.Partitions); err != nil {
		return Table{}, fmt.Errorf("MBR: %w", err)
	}
	return t, nil
}
