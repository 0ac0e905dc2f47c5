package vmm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"sync"
	"unsafe"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
	"golang.org/x/sys/unix"
)

// Default guest-physical layout: RAM from 0 up to the 32-bit MMIO hole,
// the rest above 4 GiB. The hole holds the IOAPIC (0xfec00000), the LAPIC
// (0xfee00000), virtio-mmio windows and the TSS/identity-map pages KVM needs.
const (
	DefaultMMIOHoleStart = x86.MMIOHoleStart
	MMIOHoleEnd          = x86.MMIOHoleEnd
)

// pageSize is the granularity of guest memory regions.
const pageSize = 4096

// ErrOutOfRange is wrapped by Memory accesses outside guest RAM.
var ErrOutOfRange = errors.New("guest memory access outside RAM")

// ErrMemoryClosed is returned by Memory accesses after Close.
var ErrMemoryClosed = errors.New("guest memory is closed")

// MemoryRegion is one contiguous range of guest RAM.
type MemoryRegion struct {
	GPA  uint64
	Size uint64
}

// End returns the first address after the region.
func (r MemoryRegion) End() uint64 { return r.GPA + r.Size }

// Layout splits size bytes of RAM around the 32-bit MMIO hole starting at
// holeStart: [0, holeStart) and, for the remainder, [4 GiB, …).
func Layout(size, holeStart uint64) []MemoryRegion {
	if size <= holeStart {
		return []MemoryRegion{{GPA: 0, Size: size}}
	}
	return []MemoryRegion{{GPA: 0, Size: holeStart}, {GPA: MMIOHoleEnd, Size: size - holeStart}}
}

// Memory is guest RAM: anonymous host mappings, one per region. ReadAt,
// WriteAt and CheckRange are safe for concurrent use (by vCPU threads and
// device goroutines) and fail with an error, never a panic, for any gpa and
// length; after Close they fail with ErrMemoryClosed.
type Memory struct {
	// hostPageSize is the host's page size, what Discard gives back whole.
	hostPageSize uint64

	mu      sync.RWMutex
	regions []mappedRegion // sorted by GPA, non-overlapping
	image   *keptImage     // for RAM mapped from an image: its file
	closed  bool
}

type mappedRegion struct {
	MemoryRegion
	host        []byte
	imageOffset int64 // where its bytes start in the image (WriteTo's layout)
}

// NewMemory maps the regions (each page-aligned, non-empty, non-overlapping).
// Untouched pages cost no host memory (MAP_NORESERVE, demand paging); see
// ramap.go for huge pages.
func NewMemory(regions []MemoryRegion) (*Memory, error) {
	return newMemory(regions, nil)
}

// MemoryImage is guest RAM saved in a file (a snapshot's memory section):
// the regions' bytes one after the other, in address order, from Offset (a
// multiple of 4 KiB) of the file whose descriptor is FD.
type MemoryImage struct {
	FD     int
	Offset int64
}

// NewMemoryFromImage maps the regions copy-on-write from img
// (MAP_PRIVATE): a page is read from the file when the guest first
// touches it, and what the guest writes never reaches the file (see
// ramap.go for why it is not copied). The caller may close the file once
// it returns (Memory keeps a duplicate descriptor until Close, to find
// the image's holes when it writes RAM: sparse.go).
func NewMemoryFromImage(regions []MemoryRegion, img MemoryImage) (*Memory, error) {
	if hostPage := int64(os.Getpagesize()); img.Offset < 0 || img.Offset%hostPage != 0 {
		return nil, fmt.Errorf("guest memory image offset %d: must be a non-negative multiple of this host's %d-byte pages", img.Offset, hostPage)
	}
	// A mapping past the file's end would fault (SIGBUS) when touched.
	var need int64
	for _, r := range regions {
		need += int64(r.Size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(img.FD, &st); err != nil {
		return nil, fmt.Errorf("guest memory image: %w", err)
	}
	if st.Size-img.Offset < need {
		return nil, fmt.Errorf("guest memory image: %d bytes from offset %d, guest RAM is %d", max(st.Size-img.Offset, 0), img.Offset, need)
	}
	if tmpfsShort(img.FD, st.Blocks*512, need) {
		return copyImage(regions, img, need)
	}
	return newMemory(regions, &img)
}

// tmpfsShort says whether the image is on a tmpfs with too little room for
// the holes of a mapping of need bytes of it (allocated is what the file
// takes). A tmpfs gives a private mapping's touch of a hole a page of its
// own, charged to its size, and fails the fault when it is full: a SIGBUS
// in the VMM, EFAULT in KVM, whenever the guest or a device first touches
// a page it never had. Other file systems map a hole's page from their
// page cache at no charge.
func tmpfsShort(fd int, allocated, need int64) bool {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return false
	}
	free := int64(fs.Bavail) * fs.Bsize
	return free < need-allocated+need/8 // the holes, and room for the rest
}

// copyImage makes anonymous memory of regions holding img's bytes: the
// image's data extents are read in (holes stay untouched zeros), so the
// memory depends on the file no longer (tmpfsShort). It costs the image's
// data in host RAM at once, where a mapping reads it in as touched.
func copyImage(regions []MemoryRegion, img MemoryImage, need int64) (*Memory, error) {
	m, err := newMemory(regions, nil)
	if err != nil {
		return nil, err
	}
	data := scanImageData(img.FD, img.Offset, need)
	extents := data.extents
	if data.known < need { // past the extents it could tell: data
		extents = append(extents, [2]int64{data.known, need})
	}
	for _, r := range m.regions {
		if err := readExtents(img, r, extents); err != nil {
			m.Close()
			return nil, fmt.Errorf("guest memory image: %w", err)
		}
	}
	return m, nil
}

// readExtents reads the parts of extents (image offsets) that fall in r
// into r's memory.
func readExtents(img MemoryImage, r mappedRegion, extents [][2]int64) error {
	start, end := r.imageOffset, r.imageOffset+int64(r.Size)
	for _, e := range extents {
		from, to := max(e[0], start), min(e[1], end)
		for from < to {
			n, err := unix.Pread(img.FD, r.host[from-start:to-start], img.Offset+from)
			if err != nil {
				return err
			}
			if n == 0 {
				return errors.New("the image ends early")
			}
			from += int64(n)
		}
	}
	return nil
}

func newMemory(regions []MemoryRegion, img *MemoryImage) (*Memory, error) {
	if len(regions) == 0 {
		return nil, errors.New("guest memory: no regions")
	}
	sorted := append([]MemoryRegion(nil), regions...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].GPA < sorted[j].GPA })
	for i, r := range sorted {
		if r.Size == 0 || r.GPA%pageSize != 0 || r.Size%pageSize != 0 {
			return nil, fmt.Errorf("guest memory region [%#x, +%#x): must be non-empty and 4 KiB aligned", r.GPA, r.Size)
		}
		if r.GPA+r.Size < r.GPA {
			return nil, fmt.Errorf("guest memory region [%#x, +%#x) wraps the address space", r.GPA, r.Size)
		}
		if i > 0 && sorted[i-1].End() > r.GPA {
			return nil, fmt.Errorf("guest memory regions at %#x and %#x overlap", sorted[i-1].GPA, r.GPA)
		}
	}
	m := &Memory{hostPageSize: uint64(os.Getpagesize())}
	var offset int64
	for _, r := range sorted {
		host, err := mapRegion(r, img, offset)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("mapping %d MiB of guest memory at %#x: %w", r.Size>>20, r.GPA, err)
		}
		m.regions = append(m.regions, mappedRegion{MemoryRegion: r, host: host, imageOffset: offset})
		offset += int64(r.Size)
	}
	if img != nil {
		m.image = keepImage(*img, offset)
	}
	return m, nil
}

// mapRegion maps region r: anonymous, or from img at offset (from the
// image's start).
func mapRegion(r MemoryRegion, img *MemoryImage, offset int64) ([]byte, error) {
	if img != nil {
		return mapImageRAM(img.FD, img.Offset+offset, r.Size)
	}
	return mapAnonymousRAM(r.Size)
}

// WriteTo writes every region's bytes to w, in address order (the layout
// NewMemoryFromImage maps back).
func (m *Memory) WriteTo(w io.Writer) (_ int64, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer faultIsError(&err)
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, ErrMemoryClosed
	}
	var total int64
	for _, r := range m.regions {
		n, err := w.Write(r.host)
		total += int64(n)
		if err != nil {
			return total, fmt.Errorf("writing guest memory at %#x: %w", r.GPA, err)
		}
	}
	return total, nil
}

// Reader returns a reader of the bytes WriteTo writes. It implements
// io.WriterTo and snapshot.SparseSource (WriteSparse), so a snapshot of it
// skips the pages the guest never touched without reading them.
func (m *Memory) Reader() io.Reader { return &memoryReader{m: m} }

// memoryReader reads guest RAM, regions in address order, from off.
type memoryReader struct {
	m   *Memory
	off int64
}

func (r *memoryReader) Read(p []byte) (int, error) {
	r.m.mu.RLock()
	defer r.m.mu.RUnlock()
	if r.m.closed {
		return 0, ErrMemoryClosed
	}
	start := r.off
	for _, reg := range r.m.regions {
		if len(p) == 0 {
			break
		}
		if in := r.off - reg.imageOffset; in >= 0 && in < int64(len(reg.host)) {
			c := copy(p, reg.host[in:])
			p, r.off = p[c:], r.off+int64(c)
		}
	}
	if r.off == start && len(p) > 0 {
		return 0, io.EOF
	}
	return int(r.off - start), nil
}

// WriteTo writes the rest of guest RAM to w.
func (r *memoryReader) WriteTo(w io.Writer) (int64, error) {
	return io.Copy(w, struct{ io.Reader }{r})
}

// WriteSparse implements snapshot.SparseSource from the start of RAM;
// once Read has begun, it writes the rest unskipped.
func (r *memoryReader) WriteSparse(w io.Writer, skip func(n int64) error) (int64, error) {
	if r.off != 0 {
		return r.WriteTo(w)
	}
	n, err := r.m.WriteSparse(w, skip)
	r.off += n
	return n, err
}

// Regions returns the RAM regions, sorted by address.
func (m *Memory) Regions() []MemoryRegion {
	out := make([]MemoryRegion, len(m.regions))
	for i, r := range m.regions {
		out[i] = r.MemoryRegion
	}
	return out
}

// Size returns the total RAM in bytes.
func (m *Memory) Size() uint64 {
	var n uint64
	for _, r := range m.regions {
		n += r.Size
	}
	return n
}

// find returns the host bytes for [gpa, gpa+n), which must lie in one
// region. The caller holds m.mu.
func (m *Memory) find(gpa, n uint64) ([]byte, error) {
	if m.closed {
		return nil, ErrMemoryClosed
	}
	for _, r := range m.regions {
		if gpa >= r.GPA && gpa-r.GPA < r.Size {
			off := gpa - r.GPA
			if n > r.Size-off {
				return nil, fmt.Errorf("%w: [%#x, +%#x) runs past the RAM region ending at %#x", ErrOutOfRange, gpa, n, r.End())
			}
			return r.host[off : off+n : off+n], nil
		}
	}
	return nil, fmt.Errorf("%w: %#x is not in guest RAM", ErrOutOfRange, gpa)
}

// CheckRange returns an error unless [gpa, gpa+length) is inside one RAM region.
func (m *Memory) CheckRange(gpa, length uint64) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, err := m.find(gpa, length)
	return err
}

// ReadAt copies guest memory at gpa into p, all or nothing.
func (m *Memory) ReadAt(p []byte, gpa uint64) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, err := m.find(gpa, uint64(len(p)))
	if err != nil {
		return err
	}
	copy(p, b)
	return nil
}

// WriteAt copies p into guest memory at gpa, all or nothing.
func (m *Memory) WriteAt(p []byte, gpa uint64) error {
	m.mu.RLock() // the read lock guards the mapping, not the bytes
	defer m.mu.RUnlock()
	b, err := m.find(gpa, uint64(len(p)))
	if err != nil {
		return err
	}
	copy(b, p)
	return nil
}

// Slice returns the host bytes backing [gpa, gpa+n), for loaders and table
// builders that write in place before the VM starts, and for devices doing
// zero-copy I/O (virtio.Slicer) between their Activate and Reset. The slice
// is only valid until Close: never keep it, never hand it to code that may
// outlive the VM (machine.Stop resets every device before it closes the
// memory).
func (m *Memory) Slice(gpa, n uint64) ([]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.find(gpa, n)
}

// Discard implements virtio.Discarder: it drops the host pages behind
// [gpa, gpa+length) (madvise MADV_DONTNEED), which must be 4 KiB aligned
// and lie in one RAM region. The host reuses them at once; the guest next
// reads zeros there, or for RAM mapped from a snapshot the snapshot's
// bytes (its private copies are what is dropped). KVM's MMU notifier
// drops its own mappings of the range with them. On a host whose pages
// are larger (16 or 64 KiB on arm64), only the host pages wholly inside
// the range go: a part of one still holds guest pages in use.
func (m *Memory) Discard(gpa, length uint64) (uint64, error) {
	if gpa%pageSize != 0 || length%pageSize != 0 || length == 0 {
		return 0, fmt.Errorf("guest memory discard of [%#x, +%#x): not whole 4 KiB pages", gpa, length)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, err := m.find(gpa, length)
	if err != nil {
		return 0, err
	}
	b = wholeHostPages(b, m.hostPageSize)
	if len(b) == 0 {
		return 0, nil
	}
	if err := unix.Madvise(b, unix.MADV_DONTNEED); err != nil {
		return 0, err
	}
	return uint64(len(b)), nil
}

// wholeHostPages is the part of b (a slice of a page-aligned mapping) made
// of whole host pages of hostPage bytes.
func wholeHostPages(b []byte, hostPage uint64) []byte {
	if len(b) == 0 {
		return b
	}
	start := uint64(uintptr(unsafe.Pointer(&b[0])))
	first := (start + hostPage - 1) &^ (hostPage - 1)
	end := (start + uint64(len(b))) &^ (hostPage - 1)
	if first >= end {
		return nil
	}
	return b[first-start : end-start]
}

// Close unmaps guest memory. Later accesses fail with ErrMemoryClosed.
// Idempotent.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.image.close()
	var firstErr error
	for _, r := range m.regions {
		if err := unmapRAM(r.host); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("unmapping guest memory at %#x: %w", r.GPA, err)
		}
	}
	return firstErr
}
