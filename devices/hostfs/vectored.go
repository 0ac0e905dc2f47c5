package hostfs

import (
	"golang.org/x/sys/unix"
)

// iovMax is the most buffers one preadv or pwritev takes (UIO_MAXIOV).
const iovMax = 1024

// ReadvAt implements Node. A virtio-fs request carries its data as the
// guest's pages, one buffer each (256 for 1 MiB): one preadv moves them
// all, where one pread per page would cost a system call each.
func (f *file) ReadvAt(iov [][]byte, offset int64) (int, error) {
	if err := f.ex.enter(); err != nil {
		return 0, err
	}
	defer f.ex.exit()
	fd, err := f.ioDescriptor(offset)
	if err != nil {
		return 0, err
	}
	return transferVector(iov, offset, func(part [][]byte, off int64) (int, error) {
		return unix.Preadv(fd, part, off)
	})
}

// WritevAt implements Node, in one pwritev as ReadvAt. A set-user-ID or
// set-group-ID bit of the file is cleared first (killPriv), once for the
// whole list.
func (f *file) WritevAt(iov [][]byte, offset int64) (int, error) {
	if err := f.beginMutation(); err != nil {
		return 0, err
	}
	defer f.ex.exit()
	fd, err := f.ioDescriptor(offset)
	if err != nil {
		return 0, err
	}
	if err := killPriv(fd); err != nil {
		return 0, err
	}
	return transferVector(iov, offset, func(part [][]byte, off int64) (int, error) {
		return unix.Pwritev(fd, part, off)
	})
}

// ioDescriptor returns the descriptor of an open file for a read or write
// at offset (EBADF when not open, EINVAL for a negative offset). Called
// between enter and exit.
func (f *file) ioDescriptor(offset int64) (int, error) {
	fd, err := f.openDescriptor()
	if err == nil && offset < 0 {
		err = unix.EINVAL
	}
	return fd, err
}

// transferVector runs op over iov at most iovMax buffers at a time, from
// offset on, until a short or failed transfer. An error after some bytes
// moved is dropped, as pread and pwrite report it: the caller sees the
// count, and the next call gets the error.
func transferVector(iov [][]byte, offset int64, op func([][]byte, int64) (int, error)) (int, error) {
	total := 0
	for len(iov) > 0 {
		part := iov[:min(len(iov), iovMax)]
		iov = iov[len(part):]
		n, err := op(part, offset)
		if n < 0 {
			n = 0
		}
		total += n
		offset += int64(n)
		if err != nil {
			if total > 0 {
				return total, nil
			}
			return 0, err
		}
		if n < vectorLen(part) {
			break
		}
	}
	return total, nil
}

// vectorLen is the number of bytes in iov.
func vectorLen(iov [][]byte) int {
	n := 0
	for _, b := range iov {
		n += len(b)
	}
	return n
}
