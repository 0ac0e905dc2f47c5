package bundle

import (
	"errors"
	"fmt"
	"io"
	"sort"
)

// SectorSize is the logical sector size the partition tables are read with.
// Raw cloud images use 512; 4 KiB-sector images are not supported.
const SectorSize = 512

// maxPartitions bounds the partitions in use a table may hold (GPT's usual
// array has 128 entries; an MBR has 4), so that what an image makes this
// package read and keep does not grow with a count field.
const maxPartitions = 128

// TableKind is the kind of partition table an image has.
type TableKind int

const (
	// TableNone: no partition table; the whole file is one filesystem.
	TableNone TableKind = iota
	// TableMBR: an MBR (DOS) table, its four primary entries.
	TableMBR
	// TableGPT: a GUID partition table (primary, or backup when the
	// primary is bad).
	TableGPT
)

func (k TableKind) String() string {
	switch k {
	case TableMBR:
		return "MBR"
	case TableGPT:
		return "GPT"
	default:
		return "none"
	}
}

// Partition is one used entry of a partition table.
type Partition struct {
	// Number is the entry's 1-based number as Linux names it (sda1 is
	// number 1, sda15 number 15).
	Number int
	// Start and Length are in bytes from the image's start; both are
	// multiples of SectorSize and the range lies inside the image.
	Start, Length int64
	// Type is the GPT partition type (zero for MBR).
	Type GUID
	// MBRType is the MBR system id (zero for GPT).
	MBRType byte
	// Name is the GPT partition name, decoded from UTF-16 (empty for MBR).
	Name string
}

// TypeName describes the partition's type for logs ("EFI system",
// "MBR type 0x83", or the GUID when it is not one this package names).
func (p Partition) TypeName() string {
	if p.MBRType != 0 {
		return fmt.Sprintf("MBR type 0x%02x", p.MBRType)
	}
	if name, ok := guidNames[p.Type]; ok {
		return name
	}
	return p.Type.String()
}

// Table is an image's partition table, validated.
type Table struct {
	Kind TableKind
	// Partitions are the used entries by Number, inside the image and
	// not overlapping. Empty for TableNone.
	Partitions []Partition
	// Notes say what was read around: a bad primary GPT replaced by its
	// backup, an MBR extended partition not followed.
	Notes []string
	// HeaderCRC and ArrayCRC are the GPT header's and partition array's
	// CRC32s as validated (zero otherwise); they take part in Identity.
	HeaderCRC, ArrayCRC uint32
}

// ReadTable reads the partition table of the image r of size bytes:
// a GPT (a protective MBR, or the "EFI PART" signature at LBA 1), else an
// MBR, else none. Every offset and count is checked against size and this
// package's bounds; a table that claims more than the image holds is an
// error, never a read past it.
func ReadTable(r io.ReaderAt, size int64) (Table, error) {
	if size < 2*SectorSize {
		return Table{}, fmt.Errorf("%d bytes: too small for a partition table or a filesystem", size)
	}
	var sector0 [SectorSize]byte
	if err := readFull(r, sector0[:], 0); err != nil {
		return Table{}, err
	}
	mbr := parseMBR(sector0[:])
	switch {
	case mbr.protective:
		return readGPT(r, size)
	case !mbr.valid || len(mbr.entries) == 0:
		if hasGPTSignature(r) {
			return readGPT(r, size)
		}
		return Table{Kind: TableNone}, nil
	default:
		return mbrTable(mbr, size)
	}
}

// checkPartitions sorts ps by start and refuses overlaps and too many.
func checkPartitions(ps []Partition) error {
	if len(ps) > maxPartitions {
		return fmt.Errorf("%d partitions in use, more than the %d this reader accepts", len(ps), maxPartitions)
	}
	byStart := append([]Partition(nil), ps...)
	sort.Slice(byStart, func(i, j int) bool { return byStart[i].Start < byStart[j].Start })
	for i := 1; i < len(byStart); i++ {
		prev, cur := byStart[i-1], byStart[i]
		if cur.Start < prev.Start+prev.Length {
			return fmt.Errorf("partitions %d and %d overlap", prev.Number, cur.Number)
		}
	}
	return nil
}

// errShortImage is returned when a read the table or a superblock needs
// falls past the end of the image.
var errShortImage = errors.New("the image ends before it")

// readFull reads exactly len(buf) bytes at off, or says why not.
func readFull(r io.ReaderAt, buf []byte, off int64) error {
	n, err := r.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return fmt.Errorf("reading %d bytes at byte %d: %w", len(buf), off, errShortImage)
	}
	return fmt.Errorf("reading %d bytes at byte %d: %w", len(buf), off, err)
}
