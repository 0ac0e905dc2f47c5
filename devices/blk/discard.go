package blk

import (
	"encoding/binary"
	"errors"
	"io"

	"golang.org/x/sys/unix"
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
	switch {
	case r.typ == typeDiscard:
		// Discarding is advisory: where the host cannot punch holes
		// the data stays, which the spec allows.
		if err = w.d.punchHole(off, size); unsupported(err) {
			err = nil
		}
	case flags&flagUnmap != 0:
		err = w.zeroRange(off, size, true)
	default:
		err = w.zeroRange(off, size, false)
	}
	if err != nil {
		return w.hostFailed(r, "fallocate", err)
	}
	return statusOK
}

// zeroRange makes [off, off+size) read as zeros: by punching a hole when
// unmap allows deallocating, else (or where holes are unsupported) with
// FALLOC_FL_ZERO_RANGE, else by writing zeros.
func (w *worker) zeroRange(off, size int64, unmap bool) error {
	if unmap {
		if err := w.d.punchHole(off, size); !unsupported(err) {
			return err
		}
	}
	if err := w.d.allocate(unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, size); !unsupported(err) {
		return err
	}
	return w.writeZeros(off, size)
}

// zeroChunk is the size of the zeros written per pwrite where the host
// cannot zero a range itself.
const zeroChunk = 256 << 10

// writeZeros writes size zero bytes at off, from one shared buffer.
func (w *worker) writeZeros(off, size int64) error {
	if w.zeros == nil {
		w.zeros = make([]byte, zeroChunk)
	}
	iov := make([][]byte, 1)
	for size > 0 {
		iov[0] = w.zeros[:min(size, zeroChunk)]
		n, err := w.d.transfer(iov, off, true)
		if err != nil {
			return err
		}
		off += int64(n)
		size -= int64(n)
	}
	return nil
}

// unsupported reports whether err says the host filesystem lacks the
// fallocate mode asked for.
func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS)
}
