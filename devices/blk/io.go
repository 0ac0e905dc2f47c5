package blk

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// Data moves between the image and guest memory in place: a request's
// data buffers are mapped (virtio.Slicer) into host slices, which become
// the iovec of one preadv or pwritev, as virtio-fs does. The guest may
// change its buffers meanwhile; it only changes its own data.

// iovMax is the most buffers one preadv or pwritev takes (UIO_MAXIOV).
const iovMax = 1024

// segments maps bytes [skip, skip+n) of bufs, which hold at least that
// many, to host slices of guest memory, refusing more than SegMax of
// them or one longer than SizeMax. The result reuses w.iov.
func (w *worker) segments(bufs []virtio.Buffer, skip, n uint32) ([][]byte, error) {
	iov := w.iov[:0]
	for _, b := range bufs {
		if n == 0 {
			break
		}
		if skip >= b.Len {
			skip -= b.Len
			continue
		}
		chunk := min(b.Len-skip, n)
		switch {
		case len(iov) == SegMax:
			return nil, guestErr("more than %d data segments", SegMax)
		case chunk > SizeMax:
			return nil, guestErr("data segment of %d bytes exceeds %d", chunk, SizeMax)
		}
		p, err := w.slicer.Slice(b.Addr+uint64(skip), uint64(chunk))
		if err != nil {
			return nil, fmt.Errorf("mapping guest buffer [%#x, +%#x): %w", b.Addr+uint64(skip), chunk, err)
		}
		iov = append(iov, p)
		n -= chunk
		skip = 0
	}
	w.iov = iov
	return iov, nil
}

// transfer moves all of iov at off: preadv (write false) or pwritev,
// again after a short transfer. It returns how many bytes moved; a read
// that meets the end of the file (an image shrunk under the device) is
// io.ErrUnexpectedEOF. iov's slices are consumed.
func (d *Device) transfer(iov [][]byte, off int64, write bool) (int, error) {
	total := 0
	for len(iov) > 0 {
		part := iov[:min(len(iov), iovMax)]
		var n int
		var err error
		cerr := d.raw.Control(func(fd uintptr) {
			if write {
				n, err = unix.Pwritev(int(fd), part, off)
			} else {
				n, err = unix.Preadv(int(fd), part, off)
			}
		})
		switch {
		case cerr != nil:
			return total, cerr
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return total, err
		case n <= 0 && write:
			return total, io.ErrShortWrite
		case n <= 0:
			return total, io.ErrUnexpectedEOF
		}
		total += n
		off += int64(n)
		iov = consume(iov, n)
	}
	return total, nil
}

// consume drops the first n bytes of iov.
func consume(iov [][]byte, n int) [][]byte {
	for n > 0 && len(iov) > 0 {
		if n < len(iov[0]) {
			iov[0] = iov[0][n:]
			return iov
		}
		n -= len(iov[0])
		iov = iov[1:]
	}
	return iov
}

// fdatasync makes completed writes stable.
func (d *Device) fdatasync() error {
	return d.retry(func(fd int) error { return unix.Fdatasync(fd) })
}

// punchHole deallocates [off, off+size), which then reads as zeros.
func (d *Device) punchHole(off, size int64) error {
	return d.allocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, size)
}

// allocate is fallocate(2) with mode over [off, off+size).
func (d *Device) allocate(mode uint32, off, size int64) error {
	return d.retry(func(fd int) error { return d.fallocate(fd, mode, off, size) })
}

// retry runs op on the file's descriptor, again while it is interrupted.
func (d *Device) retry(op func(fd int) error) error {
	for {
		var err error
		if cerr := d.raw.Control(func(fd uintptr) { err = op(int(fd)) }); cerr != nil {
			return cerr
		}
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
