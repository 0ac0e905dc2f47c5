package snapshot

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// FormatVersion is the version of the layout this package writes; a file
// of another version is refused.
const FormatVersion = 1

// magic opens every snapshot file.
var magic = [8]byte{'C', 'W', 'V', 'M', 'S', 'N', 'A', 'P'}

// Layout constants.
const (
	preambleSize = 16 // magic, version u32, header length u32
	// align is where the writer starts sections: on 64 KiB, the largest
	// arm64 page, so that guest memory maps straight from the file on a
	// host of 4, 16 or 64 KiB pages alike (mmap's offset is in host
	// pages). readAlign is what a reader insists on: 4 KiB pages, as
	// files before 64 KiB alignment have them.
	align        = 0x10000
	readAlign    = 4096
	maxHeader    = 1 << 20 // a header is a few hundred bytes; more is not ours
	maxSections  = 64
	checksumSize = 4
)

// Identity is what a snapshot was taken of. A snapshot restores only into
// a VM of the same identity: another build of the helper, another guest
// kernel or another memory size or vCPU count would not fit the state.
type Identity struct {
	Build       string `json:"build"`  // the helper binary (version and hash)
	Kernel      string `json:"kernel"` // the guest kernel's hash
	MemoryBytes uint64 `json:"memoryBytes"`
	CPUs        int    `json:"cpus"`
}

// Section is one named part of a snapshot, written from Data (Size bytes).
// Data may implement SparseSource, and then its known zero blocks are
// skipped without being read.
type Section struct {
	Name string
	Size int64
	Data io.Reader
}

// header is the JSON after the preamble.
type header struct {
	Identity Identity      `json:"identity"`
	Sections []sectionInfo `json:"sections"`
}

// sectionInfo places one section in the file.
type sectionInfo struct {
	Name   string `json:"name"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
}

// ErrMismatch is wrapped by Open's error for a valid snapshot of another
// identity (a new build, kernel or size: expected, not damage).
var ErrMismatch = errors.New("the snapshot was taken of another VM")

// Write writes a snapshot of id holding sections, in order, to w.
func Write(w io.Writer, id Identity, sections []Section) error {
	if len(sections) > maxSections {
		return fmt.Errorf("snapshot: %d sections, at most %d", len(sections), maxSections)
	}
	h := header{Identity: id}
	hdr, err := layout(&h, sections)
	if err != nil {
		return err
	}
	out := newBlockWriter(w)
	var pre [preambleSize]byte
	copy(pre[:8], magic[:])
	binary.LittleEndian.PutUint32(pre[8:], FormatVersion)
	binary.LittleEndian.PutUint32(pre[12:], uint32(len(hdr)))
	if _, err := out.Write(append(pre[:], hdr...)); err != nil {
		return fmt.Errorf("snapshot: writing the header: %w", err)
	}
	for i, s := range sections {
		if err := out.pad(h.Sections[i].Offset); err != nil {
			return err
		}
		if err := writeSection(out, s); err != nil {
			return err
		}
	}
	sum, err := out.finish()
	if err != nil {
		return fmt.Errorf("snapshot: writing: %w", err)
	}
	var trailer [checksumSize]byte
	binary.LittleEndian.PutUint32(trailer[:], sum)
	if _, err := w.Write(trailer[:]); err != nil {
		return fmt.Errorf("snapshot: writing the checksum: %w", err)
	}
	return nil
}

// writeSection writes s's Size bytes to out, which is at the section's
// (block-aligned) offset: through WriteSparse where s.Data is a
// SparseSource, else copied.
func writeSection(out *blockWriter, s Section) error {
	src, sparse := s.Data.(SparseSource)
	if !sparse {
		if n, err := io.CopyN(out, s.Data, s.Size); err != nil {
			return fmt.Errorf("snapshot: section %s: wrote %d of %d bytes: %w", s.Name, n, s.Size, err)
		}
		return nil
	}
	sw := &sectionWriter{out: out, end: out.offset() + s.Size}
	n, err := src.WriteSparse(sw, sw.skip)
	if got := s.Size - (sw.end - out.offset()); err == nil && (n != s.Size || got != s.Size) {
		err = fmt.Errorf("the source gave %d bytes (and said %d)", got, n)
	}
	if err != nil {
		return fmt.Errorf("snapshot: section %s of %d bytes: %w", s.Name, s.Size, err)
	}
	return nil
}

// sectionWriter is what a SparseSource writes a section to: it refuses
// bytes or skips past the section's end (they would land in the next).
type sectionWriter struct {
	out *blockWriter
	end int64 // the section's end offset
}

func (sw *sectionWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > sw.end-sw.out.offset() {
		return 0, errors.New("more bytes than the section's size")
	}
	return sw.out.Write(p)
}

func (sw *sectionWriter) skip(n int64) error {
	if n > sw.end-sw.out.offset() {
		return fmt.Errorf("a %d-byte skip past the section's end", n)
	}
	return sw.out.skip(n)
}

// layout fills h's sections with aligned offsets and returns the encoded
// header. The header's length fixes the first offset, and the offsets
// are in the header, so the offsets are computed for the longest header
// they can make (every offset in the file fits 19 digits).
func layout(h *header, sections []Section) ([]byte, error) {
	h.Sections = make([]sectionInfo, len(sections))
	for i, s := range sections {
		if s.Size < 0 {
			return nil, fmt.Errorf("snapshot: section %s has a negative size", s.Name)
		}
		h.Sections[i] = sectionInfo{Name: s.Name, Offset: 1<<62 + 1, Size: s.Size}
	}
	longest, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	next := alignUp(int64(preambleSize + len(longest)))
	for i, s := range sections {
		h.Sections[i].Offset = next
		next = alignUp(next + s.Size)
	}
	hdr, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	if len(hdr) > maxHeader {
		return nil, fmt.Errorf("snapshot: a %d-byte header, at most %d", len(hdr), maxHeader)
	}
	return hdr, nil
}

func alignUp(n int64) int64 { return (n + align - 1) &^ (align - 1) }

// File is an opened, checked snapshot.
type File struct {
	f        *os.File
	Identity Identity
	sections map[string]sectionInfo
}

// Open opens the snapshot at path and checks it: format version, identity
// (want), layout and checksum. The error wraps ErrMismatch for a sound
// snapshot of another identity.
func Open(path string, want Identity) (*File, error) {
	return open(path, want, false)
}

// OpenVerified is Open that reads the whole file to check its checksum
// only the first time: a file whose checksum matched is recorded in a
// marker beside it (path + ".verified", naming the file's inode, size and
// change time), and while the file is unchanged since, later opens trust
// it. Any write to the file (or a replacement) changes what the marker
// names, and the file is checked again.
func OpenVerified(path string, want Identity) (*File, error) {
	return open(path, want, true)
}

func open(path string, want Identity, trustMarker bool) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	sf, err := check(f, want, trustMarker, path+VerifiedSuffix)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("snapshot %s: %w", path, err)
	}
	return sf, nil
}

// MarkWritten records, as OpenVerified's marker does after a check, that
// the snapshot at path is whole as it was written: for a file this
// process has just written with Write (whose checksum came from the
// bytes written), synced and put in place. Its OpenVerified then trusts
// it while it is unchanged, sparing the restore (or a read-back at once,
// which reads only the page cache) a pass over the whole file.
func MarkWritten(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	writeMarker(path+VerifiedSuffix, fileStamp(st))
	return nil
}

// VerifiedSuffix names the marker OpenVerified keeps beside a snapshot
// (remove it with the snapshot).
const VerifiedSuffix = ".verified"

// check reads and validates f; with trustMarker, the checksum pass is
// skipped when marker names f as it is, and marker is written after one.
func check(f *os.File, want Identity, trustMarker bool, marker string) (*File, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	h, err := readHeader(f, size)
	if err != nil {
		return nil, err
	}
	if h.Identity != want { // before the checksum: no need to read it all
		return nil, fmt.Errorf("%w: taken of %+v, this VM is %+v", ErrMismatch, h.Identity, want)
	}
	stamp := fileStamp(st)
	if !trustMarker || readMarker(marker) != stamp {
		if err := verifyChecksum(f, size); err != nil {
			return nil, err
		}
		if trustMarker {
			writeMarker(marker, stamp)
		}
	}
	sf := &File{f: f, Identity: h.Identity, sections: make(map[string]sectionInfo, len(h.Sections))}
	for _, s := range h.Sections {
		sf.sections[s.Name] = s
	}
	return sf, nil
}

// fileStamp names a file's version: device, inode, size, modification
// and change times (the change time moves with any write or chmod).
func fileStamp(st os.FileInfo) string {
	stamp := fmt.Sprintf("size=%d mtime=%d", st.Size(), st.ModTime().UnixNano())
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		stamp += fmt.Sprintf(" dev=%d ino=%d ctime=%d.%09d", sys.Dev, sys.Ino, sys.Ctim.Sec, sys.Ctim.Nsec)
	}
	return stamp
}

// readMarker returns the stamp a marker holds ("" when it cannot).
func readMarker(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 512 {
		return ""
	}
	return string(b)
}

// writeMarker records stamp; a failure only costs a later check.
func writeMarker(path, stamp string) {
	tmp := path + ".tmp"
	if os.WriteFile(tmp, []byte(stamp), 0o600) == nil {
		_ = os.Rename(tmp, path)
	}
}

// readHeader reads the preamble and header of a file of size bytes and
// checks that every section lies inside the file, in order, aligned.
func readHeader(r io.ReaderAt, size int64) (*header, error) {
	var pre [preambleSize]byte
	if _, err := r.ReadAt(pre[:], 0); err != nil {
		return nil, fmt.Errorf("not a snapshot (too short): %w", err)
	}
	if [8]byte(pre[:8]) != magic {
		return nil, errors.New("not a snapshot (bad magic)")
	}
	if v := binary.LittleEndian.Uint32(pre[8:]); v != FormatVersion {
		return nil, fmt.Errorf("%w: format version %d, this build reads %d", ErrMismatch, v, FormatVersion)
	}
	n := int64(binary.LittleEndian.Uint32(pre[12:]))
	if n > maxHeader || preambleSize+n+checksumSize > size {
		return nil, fmt.Errorf("a %d-byte header does not fit a %d-byte file", n, size)
	}
	raw := make([]byte, n)
	if _, err := r.ReadAt(raw, preambleSize); err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	var h header
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("the header: %w", err)
	}
	return &h, checkSections(h.Sections, preambleSize+n, size-checksumSize)
}

// checkSections checks that sections are few, named once, aligned, in
// order from start on and end by end.
func checkSections(sections []sectionInfo, start, end int64) error {
	if len(sections) > maxSections {
		return fmt.Errorf("%d sections, at most %d", len(sections), maxSections)
	}
	seen := make(map[string]bool, len(sections))
	for _, s := range sections {
		switch {
		case seen[s.Name]:
			return fmt.Errorf("section %q twice", s.Name)
		case s.Offset%readAlign != 0 || s.Offset < start || s.Size < 0 || s.Size > end-s.Offset:
			return fmt.Errorf("section %q at %d, %d bytes, is not inside the file's [%d, %d)", s.Name, s.Offset, s.Size, start, end)
		}
		seen[s.Name] = true
		start = s.Offset + s.Size
	}
	return nil
}

// verifyChecksum compares the checksum of f's bytes before its last four
// (blockSum) with those four.
func verifyChecksum(f *os.File, size int64) error {
	got, err := fileSum(f, size-checksumSize)
	if err != nil {
		return fmt.Errorf("reading the snapshot: %w", err)
	}
	var sum [checksumSize]byte
	if _, err := f.ReadAt(sum[:], size-checksumSize); err != nil {
		return fmt.Errorf("reading the checksum: %w", err)
	}
	if want := binary.LittleEndian.Uint32(sum[:]); got != want {
		return fmt.Errorf("checksum %08x, the file says %08x: the snapshot is damaged", got, want)
	}
	return nil
}

// Section returns a reader of the named section and its file offset (a
// multiple of 64 KiB in files written now, of 4 KiB in older ones, for
// mapping); false if the snapshot has none.
func (f *File) Section(name string) (*io.SectionReader, int64, bool) {
	s, ok := f.sections[name]
	if !ok {
		return nil, 0, false
	}
	return io.NewSectionReader(f.f, s.Offset, s.Size), s.Offset, true
}

// Fd returns the file's descriptor (to map a section MAP_PRIVATE).
func (f *File) Fd() uintptr { return f.f.Fd() }

// Close closes the file.
func (f *File) Close() error { return f.f.Close() }
