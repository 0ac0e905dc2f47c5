package vmm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"

	"golang.org/x/sys/unix"
)

// Writing guest RAM to a snapshot without touching what the guest never
// touched. Reading a page the guest never touched costs a page fault
// (anonymous RAM maps the zero page; RAM mapped from a snapshot reads the
// page from that file), one per 4 KiB of RAM whatever the guest used. The
// kernel knows which pages were never touched: /proc/self/pagemap has an
// entry per page of the process, and a page neither present (bit 63) nor
// swapped (bit 62) holds, for anonymous RAM, zeros (never touched, or
// dropped by Discard); for RAM mapped from an image, the image file's
// bytes there, zeros where the file had a hole. WriteSparse skips those
// pages unread (snapshot.SparseSource) and reads the rest. Without a
// readable pagemap every page is read, as before.

// Bits of a pagemap entry (Documentation/admin-guide/mm/pagemap.rst).
const (
	pagemapPresent = 1 << 63
	pagemapSwapped = 1 << 62
)

// pagemapChunk is how many pagemap entries one read takes (2 MiB of RAM).
const pagemapChunk = 512

// maxImageExtents bounds the data extents of a memory image looked up
// when RAM is written (16 bytes each): past them, the image is taken to
// be all data.
const maxImageExtents = 1 << 14

// keptImage is the file RAM was mapped from, kept to find its holes
// when RAM is written (not when mapped: on ext4 scanning 16384 extents
// took 97 ms, which a restore should not wait for). The descriptor is a
// duplicate; the mapping pins the same inode anyway.
type keptImage struct {
	fd     int   // -1: not kept, no hole is known
	offset int64 // of the image in the file
	size   int64
}

// keepImage duplicates img's descriptor; without one (EMFILE), the
// image is taken to be all data.
func keepImage(img MemoryImage, size int64) *keptImage {
	fd, err := unix.FcntlInt(uintptr(img.FD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		fd = -1
	}
	return &keptImage{fd: fd, offset: img.Offset, size: size}
}

// data returns where the image holds data.
func (f *keptImage) data() *imageData {
	if f.fd < 0 {
		return &imageData{}
	}
	return scanImageData(f.fd, f.offset, f.size)
}

// close closes the kept descriptor (nil-safe, idempotent).
func (f *keptImage) close() {
	if f != nil && f.fd >= 0 {
		unix.Close(f.fd)
		f.fd = -1
	}
}

// imageData is where a memory image's file holds data, in byte offsets
// from the image's start.
type imageData struct {
	extents [][2]int64 // [start, end), sorted, disjoint
	known   int64      // extents are complete below this; data past it
}

// scanImageData records the data extents of [offset, offset+size) of fd
// (SEEK_DATA, SEEK_HOLE); where the file system cannot tell, all is data.
func scanImageData(fd int, offset, size int64) *imageData {
	d := &imageData{}
	end := offset + size
	for off := offset; off < end; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && start >= end) {
			break // no data left: the rest is a hole
		}
		if err != nil || len(d.extents) == maxImageExtents {
			d.known = max(off, start) - offset
			return d
		}
		stop, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil || stop > end {
			stop = end
		}
		d.extents = append(d.extents, [2]int64{start - offset, stop - offset})
		off = stop
	}
	d.known = size
	return d
}

// hole reports whether [off, off+n) of the image was all hole.
func (d *imageData) hole(off, n int64) bool {
	if off+n > d.known {
		return false
	}
	i := sort.Search(len(d.extents), func(i int) bool { return d.extents[i][1] > off })
	return i == len(d.extents) || d.extents[i][0] >= off+n
}

// openPagemap opens this process's pagemap; nil when it cannot be read
// (no procfs, or a kernel that refuses it).
func openPagemap() *os.File {
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil
	}
	var probe [8]byte
	if _, err := f.ReadAt(probe[:], 0); err != nil {
		f.Close()
		return nil
	}
	return f
}

// knownZero fills zero[i] with whether page first+i of r is zeros the
// host never mapped (see above), image being where r's image has data
// (nil for anonymous RAM); all false when pagemap fails.
func knownZero(pagemap *os.File, image *imageData, r mappedRegion, first int, zero []bool, buf []byte) {
	clear(zero)
	if pagemap == nil {
		return
	}
	addr := hostAddress(r.host) + uint64(first)*pageSize
	b := buf[:8*len(zero)]
	if _, err := pagemap.ReadAt(b, int64(addr/pageSize*8)); err != nil {
		return
	}
	for i := range zero {
		entry := binary.LittleEndian.Uint64(b[8*i:])
		if entry&(pagemapPresent|pagemapSwapped) != 0 {
			continue
		}
		off := r.imageOffset + int64(first+i)*pageSize
		zero[i] = image == nil || image.hole(off, pageSize)
	}
}

// WriteSparse implements snapshot.SparseSource: it writes what WriteTo
// writes, but skips pages known to be zero without reading them, so the
// cost follows the RAM the guest touched, not the RAM it has.
func (m *Memory) WriteSparse(w io.Writer, skip func(n int64) error) (_ int64, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer faultIsError(&err)
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, ErrMemoryClosed
	}
	pagemap := openPagemap()
	if pagemap != nil {
		defer pagemap.Close()
	}
	var image *imageData
	if m.image != nil && pagemap != nil {
		image = m.image.data()
	}
	var total int64
	for _, r := range m.regions {
		n, err := writeRegionSparse(w, skip, pagemap, image, r)
		total += n
		if err != nil {
			return total, fmt.Errorf("writing guest memory at %#x: %w", r.GPA, err)
		}
	}
	return total, nil
}

// writeRegionSparse writes r as WriteSparse does, a chunk of pagemap at a
// time: runs of known zero pages skipped, the others written.
func writeRegionSparse(w io.Writer, skip func(int64) error, pagemap *os.File, image *imageData, r mappedRegion) (int64, error) {
	pages := len(r.host) / pageSize
	zero := make([]bool, pagemapChunk)
	buf := make([]byte, 8*pagemapChunk)
	var total int64
	for first := 0; first < pages; first += pagemapChunk {
		chunk := zero[:min(pagemapChunk, pages-first)]
		knownZero(pagemap, image, r, first, chunk, buf)
		for i := 0; i < len(chunk); {
			j := i + 1
			for j < len(chunk) && chunk[j] == chunk[i] {
				j++
			}
			from, to := (first+i)*pageSize, (first+j)*pageSize
			var err error
			if chunk[i] {
				err = skip(int64(to - from))
			} else {
				_, err = w.Write(r.host[from:to])
			}
			if err != nil {
				return total, err
			}
			total += int64(to - from)
			i = j
		}
	}
	return total, nil
}

// faultIsError, deferred by a function that reads guest RAM on its
// goroutine with debug.SetPanicOnFault on, turns a fault reading it into
// *err instead of the end of the process. RAM mapped from an image faults
// (SIGBUS) where the image cannot be read: a tmpfs that is full allocates
// a page for a hole read through a mapping, and fails it; a file
// truncated under the VM.
func faultIsError(err *error) {
	r := recover()
	if r == nil {
		return
	}
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		*err = fmt.Errorf("vmm: guest memory at host address %#x cannot be read (is the file system of the snapshot it was restored from full?): %v", f.Addr(), r)
		return
	}
	panic(r)
}
