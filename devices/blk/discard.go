package blk

import (
	"encoding/binary"
	"io"
)

// discardOrZero serves T_DISCARD and T_WRITE_ZEROES: header and segments
// readable, only the status writable. Segments are checked and applied one
// at a time; the spec leaves the earlier ones' fate open when a later one
// fails.
func (w *worker) discardOrZero(r request) byte {
	switch {
	case w.d.readOnly:
		return w.refuse(statusIOErr, r, guestErr("discard or write-zeroes on a read-only disk"))
	case r.typ == typeDiscard && !w.discard, r.typ == typeWriteZeroes && !w.writeZeroes:
		return w.refuse(statusUnsupp, r, guestErr("feature not negotiated"))
	case r.chain.WritableLen() != 1:
		return w.refuse(statusIOErr, r, guestErr("%d writable bytes before the status", r.chain.WritableLen()-1))
	}
	n := r.chain.ReadableLen() - headerSize
	if n == 0 || n%segmentSize != 0 || n/segmentSize > MaxDiscardSegments {
		return w.refuse(statusIOErr, r, guestErr("%d bytes of segments, want 1 to %d segments of %d", n, MaxDiscardSegments, segmentSize))
	}
	for range n / segmentSize {
		if status := w.discardSegment(r); status != statusOK {
			return status
		}
	}
	return w.settle(r)
}

// discardSegment reads and applies the next segment of r.
func (w *worker) discardSegment(r request) byte {
	seg := w.seg[:]
	if _, err := io.ReadFull(r.chain.Reader(), seg); err != nil {
		return w.refuse(statusIOErr, r, err)
	}
	sector := binary.LittleEndian.Uint64(seg[0:])
	count := uint64(binary.LittleEndian.Uint32(seg[8:]))
	flags := binary.LittleEndian.Uint32(seg[12:])
	switch {
	case flags&^flagUnmap != 0:
		return w.refuse(statusUnsupp, r, guestErr("unknown segment flags %#x", flags))
	case r.typ == typeDiscard && flags&flagUnmap != 0:
		return w.refuse(statusUnsupp, r, guestErr("unmap flag on a discard"))
	case count > MaxDiscardSectors:
		return w.refuse(statusIOErr, r, guestErr("segment of %d sectors exceeds %d", count, MaxDiscardSectors))
	case sector > w.d.capacity || count > w.d.capacity-sector:
		return w.refuse(statusIOErr, r, guestErr("segment [%d, +%d) runs past the capacity of %d", sector, count, w.d.capacity))
	case count == 0:
		return statusOK
	}
	off, size := int64(sector*SectorSize), int64(count*SectorSize)
	var err error
	if r.typ == typeDiscard {
		err = w.d.backing.Discard(off, size)
	} else {
		err = w.d.backing.WriteZeroes(off, size, flags&flagUnmap != 0)
	}
	if err != nil {
		return w.hostFailed(r, "discard or write-zeroes", err)
	}
	return statusOK
}
