package blk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// Request types (virtio 1.2 §5.2.6).
const (
	typeIn          uint32 = 0  // VIRTIO_BLK_T_IN
	typeOut         uint32 = 1  // VIRTIO_BLK_T_OUT
	typeFlush       uint32 = 4  // VIRTIO_BLK_T_FLUSH
	typeGetID       uint32 = 8  // VIRTIO_BLK_T_GET_ID
	typeDiscard     uint32 = 11 // VIRTIO_BLK_T_DISCARD
	typeWriteZeroes uint32 = 13 // VIRTIO_BLK_T_WRITE_ZEROES
)

// headerSize is struct virtio_blk_req's readable head: type, reserved
// (the old ioprio, ignored) and sector.
const headerSize = 16

// Discard and write-zeroes segments: struct virtio_blk_discard_write_zeroes
// (sector le64, num_sectors le32, flags le32).
const (
	segmentSize = 16
	flagUnmap   = 1 // the only flag defined
)

// errGuest is wrapped by every request the guest got wrong.
var errGuest = errors.New("bad request")

func guestErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errGuest}, args...)...)
}

// request is one chain being served, with its header decoded.
type request struct {
	chain  *virtio.Chain
	typ    uint32
	sector uint64
}

// execute decodes the header and serves the request. It returns the
// status and how many data bytes went into the guest's buffers.
func (w *worker) execute(chain *virtio.Chain) (byte, uint32) {
	if chain.ReadableLen() < headerSize {
		return w.refuseHeader(chain, guestErr("header of %d bytes, want %d", chain.ReadableLen(), headerSize)), 0
	}
	// The header is copied out once (the guest may change its buffer)
	// into the worker's array, so that decoding it allocates nothing.
	hdr := w.hdr[:]
	if _, err := io.ReadFull(chain.Reader(), hdr); err != nil {
		return w.refuseHeader(chain, err), 0
	}
	r := request{chain: chain, typ: binary.LittleEndian.Uint32(hdr[0:]), sector: binary.LittleEndian.Uint64(hdr[8:])}
	switch r.typ {
	case typeIn:
		return w.read(r)
	case typeOut:
		return w.write(r), 0
	case typeFlush:
		return w.flush(r), 0
	case typeGetID:
		return w.getID(r)
	case typeDiscard, typeWriteZeroes:
		return w.discardOrZero(r), 0
	}
	return w.refuse(statusUnsupp, r, guestErr("unknown request type")), 0
}

// refuse logs why r is answered with status (rate-limited) and returns
// status.
func (w *worker) refuse(status byte, r request, err error) byte {
	w.d.log.Warn("virtio-blk: refused a request", "type", r.typ, "sector", r.sector,
		"head", r.chain.Head(), "status", status, "err", err)
	return status
}

// refuseHeader is refuse for a request whose header could not be read.
func (w *worker) refuseHeader(chain *virtio.Chain, err error) byte {
	w.d.log.Warn("virtio-blk: refused a request", "head", chain.Head(), "status", statusIOErr, "err", err)
	return statusIOErr
}

// hostFailed logs a failed host operation (rate-limited: the guest can
// repeat it) and returns VIRTIO_BLK_S_IOERR.
func (w *worker) hostFailed(r request, op string, err error) byte {
	w.d.log.Warn("virtio-blk: host I/O failed", "op", op, "type", r.typ, "sector", r.sector, "err", err)
	return statusIOErr
}

// checkRange refuses data of n bytes at sector unless it is whole sectors
// within MaxRequestBytes and the disk. The comparisons are in sectors, so
// nothing overflows whatever sector the guest wrote.
func (w *worker) checkRange(sector uint64, n uint32) error {
	switch {
	case n%SectorSize != 0:
		return guestErr("data of %d bytes is not a whole number of %d-byte sectors", n, SectorSize)
	case n > MaxRequestBytes:
		return guestErr("data of %d bytes exceeds the %d-byte limit", n, MaxRequestBytes)
	case sector > w.d.capacity || uint64(n/SectorSize) > w.d.capacity-sector:
		return guestErr("sectors [%d, +%d) run past the capacity of %d", sector, n/SectorSize, w.d.capacity)
	}
	return nil
}

// read serves T_IN: header only readable, then data, then the status.
func (w *worker) read(r request) (byte, uint32) {
	if r.chain.ReadableLen() != headerSize {
		return w.refuse(statusIOErr, r, guestErr("%d readable bytes after the header of a read", r.chain.ReadableLen()-headerSize)), 0
	}
	n := r.chain.WritableLen() - 1
	if err := w.checkRange(r.sector, n); err != nil {
		return w.refuse(statusIOErr, r, err), 0
	}
	iov, err := w.segments(r.chain.Writable(), 0, n)
	if err != nil {
		return w.refuse(statusIOErr, r, err), 0
	}
	got, err := w.d.backing.ReadV(iov, int64(r.sector*SectorSize))
	if err != nil {
		return w.hostFailed(r, "read", err), uint32(got)
	}
	return statusOK, n
}

// write serves T_OUT: header and data readable, only the status writable.
func (w *worker) write(r request) byte {
	if w.d.readOnly {
		return w.refuse(statusIOErr, r, guestErr("write to a read-only disk"))
	}
	if r.chain.WritableLen() != 1 {
		return w.refuse(statusIOErr, r, guestErr("%d writable bytes before the status of a write", r.chain.WritableLen()-1))
	}
	n := r.chain.ReadableLen() - headerSize
	if err := w.checkRange(r.sector, n); err != nil {
		return w.refuse(statusIOErr, r, err)
	}
	iov, err := w.segments(r.chain.Readable(), headerSize, n)
	if err != nil {
		return w.refuse(statusIOErr, r, err)
	}
	if err := w.d.backing.WriteV(iov, int64(r.sector*SectorSize)); err != nil {
		return w.hostFailed(r, "write", err)
	}
	return w.settle(r)
}

// settle makes a completed write stable when the driver did not
// negotiate FLUSH: the device then promised write-through.
func (w *worker) settle(r request) byte {
	if !w.writethrough {
		return statusOK
	}
	if err := w.d.backing.Flush(); err != nil {
		return w.hostFailed(r, "flush", err)
	}
	return statusOK
}

// flush serves T_FLUSH. Data in the request (which a driver should not
// send) and the sector (which it should set to 0) are ignored: neither
// can do harm.
func (w *worker) flush(r request) byte {
	if w.d.readOnly {
		return statusOK // nothing was written
	}
	if err := w.d.backing.Flush(); err != nil {
		return w.hostFailed(r, "flush", err)
	}
	return statusOK
}

// getID serves T_GET_ID: the serial, NUL-padded to IDBytes, into a data
// buffer of at least IDBytes before the status.
func (w *worker) getID(r request) (byte, uint32) {
	if r.chain.ReadableLen() != headerSize {
		return w.refuse(statusIOErr, r, guestErr("%d readable bytes after the header of a get-id", r.chain.ReadableLen()-headerSize)), 0
	}
	if n := r.chain.WritableLen() - 1; n < IDBytes {
		return w.refuse(statusIOErr, r, guestErr("get-id buffer of %d bytes, want %d", n, IDBytes)), 0
	}
	written, err := r.chain.Writer().Write(w.d.id[:])
	if err != nil {
		return w.refuse(statusIOErr, r, err), uint32(written)
	}
	return statusOK, IDBytes
}
