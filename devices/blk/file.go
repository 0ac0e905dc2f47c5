package blk

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// File is the Backing over a raw image file: data moves between the file
// and guest memory with one preadv or pwritev per request, Flush is
// fdatasync(2), Discard punches a hole and WriteZeroes punches or zeroes
// the range.
type File struct {
	file *os.File
	raw  syscall.RawConn // the file's descriptor, held open per call
	size int64

	// fallocate is unix.Fallocate; tests replace it to play a host
	// filesystem without hole punching or zero ranges.
	fallocate func(fd int, mode uint32, off, size int64) error
	zeros     []byte // written where the host cannot zero a range; lazily
}

var _ Backing = (*File)(nil)

// NewFile returns the backing over file, a regular file whose size is a
// positive multiple of SectorSize; a writable one must be open for
// writing. The caller keeps ownership of file: it must stay open while
// the backing is in use, and the backing never closes it.
func NewFile(file *os.File, writable bool) (*File, error) {
	if file == nil {
		return nil, errors.New("virtio-blk: no image file")
	}
	capacity, err := imageSectors(file)
	if err != nil {
		return nil, err
	}
	raw, err := file.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("virtio-blk: image %s: %w", file.Name(), err)
	}
	if writable {
		if err := checkWritable(raw, file.Name()); err != nil {
			return nil, err
		}
	}
	return &File{file: file, raw: raw, size: int64(capacity * SectorSize), fallocate: unix.Fallocate}, nil
}

// imageSectors returns the capacity of the image in sectors, refusing
// what is not a regular file of a whole, positive number of sectors.
func imageSectors(file *os.File) (uint64, error) {
	info, err := file.Stat()
	if err != nil {
		return 0, fmt.Errorf("virtio-blk: image %s: %w", file.Name(), err)
	}
	size := info.Size()
	switch {
	case !info.Mode().IsRegular():
		return 0, fmt.Errorf("virtio-blk: image %s is not a regular file (%s)", file.Name(), info.Mode().Type())
	case size <= 0:
		return 0, fmt.Errorf("virtio-blk: image %s is empty", file.Name())
	case size%SectorSize != 0:
		return 0, fmt.Errorf("virtio-blk: image %s is %d bytes, not a multiple of the %d-byte sector", file.Name(), size, SectorSize)
	}
	return uint64(size) / SectorSize, nil
}

// checkWritable refuses a file opened read-only for a writable disk, so
// the mistake shows now rather than as the guest's first failed write.
func checkWritable(raw syscall.RawConn, name string) error {
	var flags int
	var ferr error
	if err := raw.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil {
		return fmt.Errorf("virtio-blk: image %s: %w", name, err)
	}
	if ferr != nil {
		return fmt.Errorf("virtio-blk: image %s: reading its open flags: %w", name, ferr)
	}
	if flags&unix.O_ACCMODE == unix.O_RDONLY {
		return fmt.Errorf("virtio-blk: image %s is open read-only but Options.ReadOnly is not set", name)
	}
	return nil
}

// Name implements Backing: the file's name.
func (f *File) Name() string { return f.file.Name() }

// Size implements Backing: the file's size when NewFile was called.
func (f *File) Size() int64 { return f.size }

// ReadV implements Backing with preadv(2) straight into iov. A read that
// meets the end of the file (an image shrunk under the device) is
// io.ErrUnexpectedEOF.
func (f *File) ReadV(iov [][]byte, off int64) (int, error) { return f.transfer(iov, off, false) }

// WriteV implements Backing with pwritev(2) straight from iov.
func (f *File) WriteV(iov [][]byte, off int64) error {
	_, err := f.transfer(iov, off, true)
	return err
}

// Flush implements Backing: fdatasync(2).
func (f *File) Flush() error {
	return f.retry(func(fd int) error { return unix.Fdatasync(fd) })
}

// Discard implements Backing by punching a hole. Discarding is advisory:
// where the host cannot punch holes the data stays, which the spec allows.
func (f *File) Discard(off, size int64) error {
	if err := f.punchHole(off, size); !unsupported(err) {
		return err
	}
	return nil
}

// WriteZeroes implements Backing: by punching a hole when unmap allows
// deallocating, else (or where holes are unsupported) with
// FALLOC_FL_ZERO_RANGE, else by writing zeros.
func (f *File) WriteZeroes(off, size int64, unmap bool) error {
	if unmap {
		if err := f.punchHole(off, size); !unsupported(err) {
			return err
		}
	}
	if err := f.allocate(unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, size); !unsupported(err) {
		return err
	}
	return f.writeZeros(off, size)
}

// iovMax is the most buffers one preadv or pwritev takes (UIO_MAXIOV).
const iovMax = 1024

// transfer moves all of iov at off: preadv (write false) or pwritev,
// again after a short transfer. It returns how many bytes moved. iov's
// slices are consumed.
func (f *File) transfer(iov [][]byte, off int64, write bool) (int, error) {
	total := 0
	for len(iov) > 0 {
		part := iov[:min(len(iov), iovMax)]
		var n int
		var err error
		cerr := f.raw.Control(func(fd uintptr) {
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

// punchHole deallocates [off, off+size), which then reads as zeros.
func (f *File) punchHole(off, size int64) error {
	return f.allocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, size)
}

// allocate is fallocate(2) with mode over [off, off+size).
func (f *File) allocate(mode uint32, off, size int64) error {
	return f.retry(func(fd int) error { return f.fallocate(fd, mode, off, size) })
}

// retry runs op on the file's descriptor, again while it is interrupted.
func (f *File) retry(op func(fd int) error) error {
	for {
		var err error
		if cerr := f.raw.Control(func(fd uintptr) { err = op(int(fd)) }); cerr != nil {
			return cerr
		}
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// zeroChunk is the size of the zeros written per pwrite where the host
// cannot zero a range itself.
const zeroChunk = 256 << 10

// writeZeros writes size zero bytes at off, from one shared buffer.
func (f *File) writeZeros(off, size int64) error {
	if f.zeros == nil {
		f.zeros = make([]byte, zeroChunk)
	}
	iov := make([][]byte, 1)
	for size > 0 {
		iov[0] = f.zeros[:min(size, zeroChunk)]
		n, err := f.transfer(iov, off, true)
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
