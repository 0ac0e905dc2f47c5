package blk

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// Data moves between the backing and guest memory in place: a request's
// data buffers are mapped (virtio.Slicer) into host slices, which a File
// makes the iovec of one preadv or pwritev, as virtio-fs does. The guest may
// change its buffers meanwhile; it only changes its own data.

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
