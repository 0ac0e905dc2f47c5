package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Guest RAM is mostly pages the guest never touched: a snapshot stores
// them as holes, and its checksum covers only blocks that hold data.
//
// The checksum: CRC-32C over, for each blockSize block of the file before
// the trailer that holds a non-zero byte, the block's index (8 bytes,
// little-endian) and then its bytes (the last block may be short). A block
// of zeros adds nothing, written or a hole: the writer need not be able to
// seek, and the reader reads only the file's data extents (SEEK_DATA).
//
// Reading a block to find it is zero costs, for guest RAM the guest never
// touched, a page fault per 4 KiB (the zero page mapped, or the page read
// from the snapshot the RAM is mapped from): 262 144 for 1 GiB. A section
// whose Data is a SparseSource names the zero blocks it knows of without
// producing them, and they are skipped unread: a hole where the writer can
// seek, zeros written where it cannot. The file is the same bytes, holes
// and checksum either way; only the work differs.

// SparseSource is a section's data that knows where some of its zero
// blocks are. WriteSparse writes the data to w in order, except that for
// a run of whole zero blocks (starting at a multiple of BlockSize from
// the section's start, a multiple of BlockSize long) it may call skip(n)
// instead of writing the n zero bytes. It returns the bytes written plus
// skipped. Any block may still be written, zeros or not.
type SparseSource interface {
	WriteSparse(w io.Writer, skip func(n int64) error) (int64, error)
}

// BlockSize is the granularity of holes, of the checksum and of a
// SparseSource's skips.
const BlockSize = blockSize

// blockSize is the granularity of holes and of the checksum.
const blockSize = 4096

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// blockSum accumulates the checksum.
type blockSum struct{ h hash.Hash32 }

func newBlockSum() blockSum { return blockSum{crc32.New(castagnoli)} }

// add counts block number index, b (at most blockSize bytes), unless it
// is all zeros.
func (s blockSum) add(index int64, b []byte) {
	if isZero(b) {
		return
	}
	var idx [8]byte
	binary.LittleEndian.PutUint64(idx[:], uint64(index))
	s.h.Write(idx[:])
	s.h.Write(b)
}

// zeroBlock is compared against: bytes.Equal is vectorised.
var zeroBlock [blockSize]byte

func isZero(b []byte) bool {
	for len(b) > blockSize {
		if !bytes.Equal(b[:blockSize], zeroBlock[:]) {
			return false
		}
		b = b[blockSize:]
	}
	return bytes.Equal(b, zeroBlock[:len(b)])
}

// blockWriter writes the snapshot's bytes through whole blocks, skipping
// zero blocks with a seek where the writer can (holes), and sums them.
type blockWriter struct {
	w      io.Writer
	seeker io.Seeker // nil: zero blocks are written out
	sum    blockSum
	block  []byte // the block being filled
	index  int64  // its number
	zeros  int64  // zero blocks skipped and not yet seeked over
}

func newBlockWriter(w io.Writer) *blockWriter {
	bw := &blockWriter{w: w, sum: newBlockSum(), block: make([]byte, 0, blockSize)}
	if s, ok := w.(io.Seeker); ok {
		if _, err := s.Seek(0, io.SeekCurrent); err == nil {
			bw.seeker = s
		}
	}
	return bw
}

// offset is how many bytes have been written.
func (bw *blockWriter) offset() int64 { return bw.index*blockSize + int64(len(bw.block)) }

func (bw *blockWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := copy(bw.block[len(bw.block):blockSize], p)
		bw.block = bw.block[:len(bw.block)+c]
		p, n = p[c:], n+c
		if len(bw.block) == blockSize {
			if err := bw.flush(); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// flush emits the current block (partial only at the end).
func (bw *blockWriter) flush() error {
	b := bw.block
	bw.block, bw.index = bw.block[:0], bw.index+1
	if bw.seeker != nil && len(b) == blockSize && isZero(b) {
		bw.zeros++
		return nil
	}
	if err := bw.skipZeros(); err != nil {
		return err
	}
	bw.sum.add(bw.index-1, b)
	_, err := bw.w.Write(b)
	return err
}

// skipZeros seeks over the zero blocks passed since the last write.
func (bw *blockWriter) skipZeros() error {
	if bw.zeros == 0 {
		return nil
	}
	_, err := bw.seeker.Seek(bw.zeros*blockSize, io.SeekCurrent)
	bw.zeros = 0
	return err
}

// skip passes n bytes of zeros (whole blocks, at a block boundary)
// without reading them: a hole where the writer seeks, zeros written
// where it cannot. Zero blocks add nothing to the checksum.
func (bw *blockWriter) skip(n int64) error {
	if len(bw.block) != 0 || n < 0 || n%blockSize != 0 {
		return fmt.Errorf("snapshot: a %d-byte skip at offset %d is not of whole blocks", n, bw.offset())
	}
	bw.index += n / blockSize
	if bw.seeker != nil {
		bw.zeros += n / blockSize
		return nil
	}
	for ; n > 0; n -= blockSize {
		if _, err := bw.w.Write(zeroBlock[:]); err != nil {
			return err
		}
	}
	return nil
}

// pad writes zeros up to offset.
func (bw *blockWriter) pad(offset int64) error {
	if offset < bw.offset() {
		return errors.New("snapshot: a section offset behind the bytes written")
	}
	for bw.offset() < offset {
		n := min(offset-bw.offset(), blockSize-int64(len(bw.block)))
		if _, err := bw.Write(zeroBlock[:n]); err != nil {
			return err
		}
	}
	return nil
}

// finish writes what is left (a hole at the end is made by the trailer
// written after it) and returns the checksum.
func (bw *blockWriter) finish() (uint32, error) {
	if len(bw.block) > 0 {
		if err := bw.flush(); err != nil {
			return 0, err
		}
	}
	if err := bw.skipZeros(); err != nil {
		return 0, err
	}
	return bw.sum.h.Sum32(), nil
}

// fileSum returns the checksum of f's first n bytes, reading only its
// data extents where the file system tells them apart from holes.
func fileSum(f *os.File, n int64) (uint32, error) {
	sum := newBlockSum()
	buf := make([]byte, blockSize)
	for off := int64(0); off < n; {
		start, end, err := nextData(f, off, n)
		if err != nil {
			return 0, err
		}
		for b := start / blockSize * blockSize; b < end; b += blockSize {
			chunk := buf[:min(blockSize, n-b)]
			if _, err := f.ReadAt(chunk, b); err != nil {
				return 0, err
			}
			sum.add(b/blockSize, chunk)
		}
		off = max(end, off+1)
	}
	return sum.h.Sum32(), nil
}

// nextData returns the next data extent [start, end) of f at or after off,
// clipped to n; [n, n) when there is none. Without SEEK_DATA the rest of
// the file is one extent.
func nextData(f *os.File, off, n int64) (int64, int64, error) {
	fd := int(f.Fd())
	start, err := unix.Seek(fd, off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return n, n, nil
	case err != nil:
		return off, n, nil // no SEEK_DATA here: read it all
	case start >= n:
		return n, n, nil
	}
	end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
	if err != nil || end > n {
		end = n
	}
	return start, end, nil
}
