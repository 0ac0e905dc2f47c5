package bundle

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"unicode/utf16"
)

// GPT header layout (UEFI spec 2.10, 5.3.2) and this reader's bounds.
const (
	gptSignature      = "EFI PART"
	gptMinHeaderSize  = 92
	gptMinEntrySize   = 128
	gptMaxEntrySize   = 4096
	gptMaxArrayBytes  = 1 << 20 // 8192 entries of 128 bytes; the usual array is 16 KiB
	gptEntryNameBytes = 72
)

// gptHeader is the part of a GPT header this reader uses, validated.
type gptHeader struct {
	lba                      uint64
	firstUsable, lastUsable  uint64
	entryLBA                 uint64
	entryCount, entrySize    uint32
	headerCRC, entryArrayCRC uint32
}

// readGPT reads the primary GPT at LBA 1 and falls back to the backup at
// the image's last LBA when the primary (header or its partition array)
// is bad.
func readGPT(r io.ReaderAt, size int64) (Table, error) {
	lastLBA := uint64(size/SectorSize) - 1
	t, primaryErr := readGPTAt(r, size, 1)
	if primaryErr == nil {
		return t, nil
	}
	t, backupErr := readGPTAt(r, size, lastLBA)
	if backupErr != nil {
		return Table{}, fmt.Errorf("GPT: primary header (LBA 1): %v; and no valid backup (LBA %d): %v", primaryErr, lastLBA, backupErr)
	}
	t.Notes = append(t.Notes, fmt.Sprintf("primary GPT (LBA 1) is bad: %v; the backup at LBA %d is used", primaryErr, lastLBA))
	return t, nil
}

func hasGPTSignature(r io.ReaderAt) bool {
	var sig [len(gptSignature)]byte
	return readFull(r, sig[:], SectorSize) == nil && string(sig[:]) == gptSignature
}

// readGPTAt reads and validates the GPT header at lba and its partition
// array.
func readGPTAt(r io.ReaderAt, size int64, lba uint64) (Table, error) {
	var sector [SectorSize]byte
	if err := readFull(r, sector[:], int64(lba)*SectorSize); err != nil {
		return Table{}, err
	}
	h, err := parseGPTHeader(sector[:], lba, uint64(size/SectorSize)-1)
	if err != nil {
		return Table{}, err
	}
	array := make([]byte, int(h.entryCount)*int(h.entrySize)) // ≤ gptMaxArrayBytes, checked
	if err := readFull(r, array, int64(h.entryLBA)*SectorSize); err != nil {
		return Table{}, fmt.Errorf("partition array: %w", err)
	}
	if got := crc32.ChecksumIEEE(array); got != h.entryArrayCRC {
		return Table{}, fmt.Errorf("partition array CRC mismatch (header says %#08x, array is %#08x)", h.entryArrayCRC, got)
	}
	parts, err := parseGPTEntries(array, h)
	if err != nil {
		return Table{}, err
	}
	return Table{Kind: TableGPT, Partitions: parts, HeaderCRC: h.headerCRC, ArrayCRC: h.entryArrayCRC}, nil
}

// parseGPTHeader validates the header in sector, read from lba of a disk
// whose last LBA is lastLBA: signature, size, CRC, its own LBA, usable
// range and partition array inside the disk, entry size and count bounded.
func parseGPTHeader(sector []byte, lba, lastLBA uint64) (gptHeader, error) {
	le := binary.LittleEndian
	if string(sector[:8]) != gptSignature {
		return gptHeader{}, fmt.Errorf("no GPT signature")
	}
	if rev := le.Uint32(sector[8:12]); rev>>16 != 1 {
		return gptHeader{}, fmt.Errorf("GPT revision %#08x is not 1.x", rev)
	}
	headerSize := le.Uint32(sector[12:16])
	if headerSize < gptMinHeaderSize || headerSize > SectorSize {
		return gptHeader{}, fmt.Errorf("header size %d outside [%d, %d]", headerSize, gptMinHeaderSize, SectorSize)
	}
	h := gptHeader{
		headerCRC:     le.Uint32(sector[16:20]),
		lba:           le.Uint64(sector[24:32]),
		firstUsable:   le.Uint64(sector[40:48]),
		lastUsable:    le.Uint64(sector[48:56]),
		entryLBA:      le.Uint64(sector[72:80]),
		entryCount:    le.Uint32(sector[80:84]),
		entrySize:     le.Uint32(sector[84:88]),
		entryArrayCRC: le.Uint32(sector[88:92]),
	}
	zeroed := bytes.Clone(sector[:headerSize])
	clear(zeroed[16:20])
	if got := crc32.ChecksumIEEE(zeroed); got != h.headerCRC {
		return gptHeader{}, fmt.Errorf("header CRC mismatch (stored %#08x, computed %#08x)", h.headerCRC, got)
	}
	if h.lba != lba {
		return gptHeader{}, fmt.Errorf("header says it is at LBA %d, read at LBA %d", h.lba, lba)
	}
	return h, h.checkBounds(lastLBA)
}

// checkBounds checks the header's LBAs against the disk's last LBA and its
// partition array against this reader's bounds.
func (h gptHeader) checkBounds(lastLBA uint64) error {
	if h.firstUsable < 2 || h.firstUsable > h.lastUsable || h.lastUsable >= lastLBA {
		return fmt.Errorf("usable LBAs %d..%d do not fit a disk whose last LBA is %d (truncated?)", h.firstUsable, h.lastUsable, lastLBA)
	}
	if h.entrySize < gptMinEntrySize || h.entrySize > gptMaxEntrySize || h.entrySize&(h.entrySize-1) != 0 {
		return fmt.Errorf("partition entry size %d is not a power of two in [%d, %d]", h.entrySize, gptMinEntrySize, gptMaxEntrySize)
	}
	arrayBytes := uint64(h.entryCount) * uint64(h.entrySize)
	if arrayBytes > gptMaxArrayBytes {
		return fmt.Errorf("partition array of %d entries of %d bytes exceeds %d bytes", h.entryCount, h.entrySize, gptMaxArrayBytes)
	}
	arraySectors := (arrayBytes + SectorSize - 1) / SectorSize
	if h.entryLBA < 2 || h.entryLBA > lastLBA || arraySectors > lastLBA-h.entryLBA+1 {
		return fmt.Errorf("partition array at LBA %d (%d sectors) does not fit a disk whose last LBA is %d", h.entryLBA, arraySectors, lastLBA)
	}
	return nil
}

// parseGPTEntries returns the used entries of array, each inside the
// header's usable range, none overlapping.
func parseGPTEntries(array []byte, h gptHeader) ([]Partition, error) {
	le := binary.LittleEndian
	var parts []Partition
	for i := range int(h.entryCount) {
		e := array[i*int(h.entrySize):][:gptMinEntrySize]
		var typ GUID
		copy(typ[:], e[0:16])
		if typ.IsZero() {
			continue
		}
		if len(parts) == maxPartitions {
			return nil, fmt.Errorf("more than %d partitions in use", maxPartitions)
		}
		first, last := le.Uint64(e[32:40]), le.Uint64(e[40:48])
		if first > last || first < h.firstUsable || last > h.lastUsable {
			return nil, fmt.Errorf("partition %d: LBAs %d..%d outside the usable %d..%d", i+1, first, last, h.firstUsable, h.lastUsable)
		}
		parts = append(parts, Partition{
			Number: i + 1,
			Start:  int64(first) * SectorSize,
			Length: int64(last-first+1) * SectorSize,
			Type:   typ,
			Name:   decodeGPTName(e[56 : 56+gptEntryNameBytes]),
		})
	}
	if err := checkPartitions(parts); err != nil {
		return nil, err
	}
	return parts, nil
}

// decodeGPTName decodes a NUL-terminated UTF-16LE name; invalid code units
// become U+FFFD.
func decodeGPTName(b []byte) string {
	units := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		u := binary.LittleEndian.Uint16(b[i:])
		if u == 0 {
			break
		}
		units = append(units, u)
	}
	return strings.ToValidUTF8(string(utf16.Decode(units)), "\uFFFD")
}
