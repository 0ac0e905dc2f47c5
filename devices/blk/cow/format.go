package cow

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
)

// The overlay file's layout (see doc.go): two map slots, then the data
// region, where byte b of the base is kept at dataOffset+b.
const (
	// ClusterSize is the unit the overlay copies up and the map tracks.
	ClusterSize = 64 << 10
	// MaxBaseSize bounds the base, and with it the map: 1 TiB is 2^24
	// clusters, a 4 MiB bitmap per slot.
	MaxBaseSize = 1 << 40
	// MaxIdentity bounds the identity string kept in the header.
	MaxIdentity = 256
	// Version is the format version written and the only one read.
	Version = 1

	headerSize = 64 + MaxIdentity // fixed fields, then the identity
	slotAlign  = 4096             // a slot starts on a page of its own
)

// magic opens every map slot.
var magic = [8]byte{'C', 'O', 'W', 'V', 'M', 'M', 'O', 'V'}

// Offsets of the header's fixed fields, little-endian.
const (
	hdrMagic       = 0  // [8]byte
	hdrVersion     = 8  // u32
	hdrClusterSize = 12 // u32
	hdrGeneration  = 16 // u64, from 1; the higher valid slot wins
	hdrBaseSize    = 24 // u64, bytes
	hdrClusters    = 32 // u64
	hdrIdentityLen = 40 // u32
	hdrHeaderCRC   = 44 // u32, CRC-32C of the header with this field zero
	hdrBitmapCRC   = 48 // u32, CRC-32C of the bitmap
	hdrReserved    = 52 // zeros up to hdrIdentity
	hdrIdentity    = 64 // [MaxIdentity]byte, zero past its length
)

// A cluster's state: two bits of the bitmap, four clusters a byte, the
// first in the low bits.
const (
	stateBase    = 0 // reads the base; nothing in the overlay
	statePresent = 1 // reads the overlay's copy
	stateZero    = 2 // reads zeros; nothing in the overlay (discarded or zeroed)
	stateInvalid = 3
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrMismatch is wrapped by Open's error when the overlay was made for
// another base (its size or its identity differ): the caller keeps such an
// overlay aside rather than serve it over the wrong bytes.
var ErrMismatch = errors.New("overlay was made for another base")

// layout is where things lie in the overlay of a base of baseSize bytes.
type layout struct {
	baseSize    int64
	clusters    int64
	bitmapBytes int64
	slotSize    int64 // each of the two slots
	dataOffset  int64 // byte 0 of the base's copy
}

// layoutFor computes the layout for a base of baseSize bytes, which must
// be a positive multiple of blk.SectorSize up to MaxBaseSize.
func layoutFor(baseSize int64) (layout, error) {
	if baseSize <= 0 || baseSize%blk.SectorSize != 0 || baseSize > MaxBaseSize {
		return layout{}, fmt.Errorf("base of %d bytes: want a positive multiple of %d up to %d", baseSize, blk.SectorSize, int64(MaxBaseSize))
	}
	clusters := (baseSize + ClusterSize - 1) / ClusterSize
	bitmap := (clusters + 3) / 4
	slot := roundUp(headerSize+bitmap, slotAlign)
	return layout{
		baseSize: baseSize, clusters: clusters, bitmapBytes: bitmap,
		slotSize: slot, dataOffset: roundUp(2*slot, ClusterSize),
	}, nil
}

func roundUp(n, unit int64) int64 { return (n + unit - 1) / unit * unit }

// fileSize is the overlay file's size: the slots and the data region.
func (l layout) fileSize() int64 { return l.dataOffset + l.baseSize }

// slotOffset is where the slot of generation gen lies: generations
// alternate between the two, so a torn write of one leaves the other.
func (l layout) slotOffset(gen uint64) int64 { return int64(gen%2) * l.slotSize }

// encodeSlot lays out generation gen of the map, states (bitmapBytes
// long), into dst (slotSize long), zero-padded.
func encodeSlot(dst []byte, l layout, gen uint64, identity string, states []byte) {
	clear(dst)
	le := binary.LittleEndian
	copy(dst[hdrMagic:], magic[:])
	le.PutUint32(dst[hdrVersion:], Version)
	le.PutUint32(dst[hdrClusterSize:], ClusterSize)
	le.PutUint64(dst[hdrGeneration:], gen)
	le.PutUint64(dst[hdrBaseSize:], uint64(l.baseSize))
	le.PutUint64(dst[hdrClusters:], uint64(l.clusters))
	le.PutUint32(dst[hdrIdentityLen:], uint32(len(identity)))
	copy(dst[hdrIdentity:], identity)
	bitmap := dst[headerSize : headerSize+l.bitmapBytes]
	copy(bitmap, states)
	le.PutUint32(dst[hdrBitmapCRC:], crc32.Checksum(bitmap, castagnoli))
	le.PutUint32(dst[hdrHeaderCRC:], crc32.Checksum(dst[:headerSize], castagnoli))
}

// slot is one decoded, checked map slot.
type slot struct {
	gen    uint64
	states []byte // bitmapBytes long, a copy
}

// errEmpty is decodeSlot's error for a slot of zeros: never written.
var errEmpty = errors.New("slot never written")

// decodeSlot checks buf, one slot read from the overlay, against the
// layout and identity of the base it is to serve, and returns its map.
// Nothing in buf is trusted: sizes come from l, which the caller computed
// from the base, and the header must agree with them.
func decodeSlot(buf []byte, l layout, identity string) (slot, error) {
	le := binary.LittleEndian
	if int64(len(buf)) < headerSize+l.bitmapBytes {
		return slot{}, fmt.Errorf("slot of %d bytes, want %d", len(buf), headerSize+l.bitmapBytes)
	}
	hdr := buf[:headerSize]
	switch {
	case !bytes.Equal(hdr[hdrMagic:hdrMagic+len(magic)], magic[:]):
		if allZero(buf) {
			return slot{}, errEmpty
		}
		return slot{}, fmt.Errorf("bad magic %q", hdr[hdrMagic:hdrMagic+len(magic)])
	case headerCRC(hdr) != le.Uint32(hdr[hdrHeaderCRC:]):
		return slot{}, errors.New("header checksum mismatch (torn or corrupt)")
	case le.Uint32(hdr[hdrVersion:]) != Version:
		return slot{}, fmt.Errorf("format version %d, this build reads %d", le.Uint32(hdr[hdrVersion:]), Version)
	case le.Uint32(hdr[hdrClusterSize:]) != ClusterSize:
		return slot{}, fmt.Errorf("cluster size %d, want %d", le.Uint32(hdr[hdrClusterSize:]), ClusterSize)
	case le.Uint64(hdr[hdrGeneration:]) == 0:
		return slot{}, errors.New("generation 0")
	case !allZero(hdr[hdrReserved:hdrIdentity]):
		return slot{}, errors.New("reserved header bytes are not zero")
	}
	idLen := le.Uint32(hdr[hdrIdentityLen:])
	if idLen > MaxIdentity || !allZero(hdr[hdrIdentity+idLen:]) {
		return slot{}, fmt.Errorf("identity of %d bytes or not zero-padded (at most %d)", idLen, MaxIdentity)
	}
	if err := checkBase(hdr, l, identity); err != nil {
		return slot{}, err
	}
	bitmap := buf[headerSize : headerSize+l.bitmapBytes]
	if crc32.Checksum(bitmap, castagnoli) != le.Uint32(hdr[hdrBitmapCRC:]) {
		return slot{}, errors.New("bitmap checksum mismatch (torn or corrupt)")
	}
	if err := checkStates(bitmap, l.clusters); err != nil {
		return slot{}, err
	}
	return slot{gen: le.Uint64(hdr[hdrGeneration:]), states: bytes.Clone(bitmap)}, nil
}

// checkBase refuses a header, intact by its checksum, made for a base of
// another size or identity than the one to serve.
func checkBase(hdr []byte, l layout, identity string) error {
	le := binary.LittleEndian
	size, clusters := le.Uint64(hdr[hdrBaseSize:]), le.Uint64(hdr[hdrClusters:])
	got := string(hdr[hdrIdentity : hdrIdentity+le.Uint32(hdr[hdrIdentityLen:])])
	switch {
	case size != uint64(l.baseSize):
		return fmt.Errorf("%w: made for a base of %d bytes, this one is %d", ErrMismatch, size, l.baseSize)
	case got != identity:
		return fmt.Errorf("%w: made for base %q, this one is %q", ErrMismatch, got, identity)
	case clusters != uint64(l.clusters):
		return fmt.Errorf("%d clusters for a base of %d bytes, want %d", clusters, size, l.clusters)
	}
	return nil
}

// checkStates refuses the invalid state and bits set past the last
// cluster.
func checkStates(bitmap []byte, clusters int64) error {
	for i, b := range bitmap {
		for j := range 4 {
			s := b >> (2 * j) & 3
			c := int64(i)*4 + int64(j)
			switch {
			case c >= clusters && s != stateBase:
				return fmt.Errorf("state %d for cluster %d past the last (%d)", s, c, clusters)
			case s == stateInvalid:
				return fmt.Errorf("invalid state %d for cluster %d", s, c)
			}
		}
	}
	return nil
}

// headerCRC is the checksum of hdr with its own field taken as zero.
func headerCRC(hdr []byte) uint32 {
	crc := crc32.Update(0, castagnoli, hdr[:hdrHeaderCRC])
	crc = crc32.Update(crc, castagnoli, []byte{0, 0, 0, 0})
	return crc32.Update(crc, castagnoli, hdr[hdrHeaderCRC+4:])
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
