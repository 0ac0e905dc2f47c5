package cow

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
)

// Base is the read-only region a Disk serves under its overlay: Length
// bytes at Offset of File (a partition inside a disk image, or all of it).
type Base struct {
	// File is the image, opened O_RDONLY by the caller, who keeps it
	// open while the Disk is in use and closes it. Its size must be a
	// multiple of blk.SectorSize, as a raw disk image's is.
	File *os.File
	// Offset and Length place the region: whole sectors, Length at most
	// MaxBaseSize, inside the file.
	Offset, Length int64
	// Identity names the base's content (for example a digest of the
	// image and the partition's place); at most MaxIdentity bytes, not
	// empty. An overlay made for another identity is refused.
	Identity string
}

// Open returns a Disk serving base with overlay, the per-profile layer:
// a regular file open for reading and writing, which the caller keeps
// open (and locked against a second user) while the Disk is in use and
// closes after Close. An empty overlay is laid out afresh; one made for
// another base is refused with an error wrapping ErrMismatch; one whose
// map cannot be read is refused, never reset.
func Open(base Base, overlay *os.File) (*Disk, error) {
	l, baseFile, err := checkBaseRegion(base)
	if err != nil {
		return nil, err
	}
	if overlay == nil {
		return nil, errors.New("cow: no overlay file")
	}
	if err := checkDistinct(base.File, overlay); err != nil {
		return nil, err
	}
	loaded, err := loadMap(overlay, l, base.Identity)
	if err != nil {
		return nil, fmt.Errorf("cow: overlay %s: %w", overlay.Name(), err)
	}
	store, err := blk.NewFile(overlay, true)
	if err != nil {
		return nil, fmt.Errorf("cow: overlay: %w", err)
	}
	return newDisk(base, l, baseFile, store, loaded), nil
}

// checkBaseRegion checks base and returns the overlay's layout for it and
// the backing that reads its file.
func checkBaseRegion(base Base) (layout, *blk.File, error) {
	switch {
	case base.File == nil:
		return layout{}, nil, errors.New("cow: no base file")
	case base.Identity == "" || len(base.Identity) > MaxIdentity:
		return layout{}, nil, fmt.Errorf("cow: base identity of %d bytes, want 1 to %d", len(base.Identity), MaxIdentity)
	case base.Offset < 0 || base.Offset%blk.SectorSize != 0:
		return layout{}, nil, fmt.Errorf("cow: base offset %d is not a whole number of %d-byte sectors", base.Offset, blk.SectorSize)
	}
	l, err := layoutFor(base.Length)
	if err != nil {
		return layout{}, nil, fmt.Errorf("cow: %w", err)
	}
	if err := checkReadOnly(base.File); err != nil {
		return layout{}, nil, err
	}
	file, err := blk.NewFile(base.File, false)
	if err != nil {
		return layout{}, nil, fmt.Errorf("cow: base: %w", err)
	}
	if base.Offset > file.Size() || base.Length > file.Size()-base.Offset {
		return layout{}, nil, fmt.Errorf("cow: base region [%d, +%d) runs past the end of %s (%d bytes)", base.Offset, base.Length, base.File.Name(), file.Size())
	}
	return l, file, nil
}

// checkReadOnly refuses a base file open for writing: the client's image
// must never be written, and a descriptor that cannot write guarantees it.
func checkReadOnly(f *os.File) error {
	flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		return fmt.Errorf("cow: base %s: reading its open flags: %w", f.Name(), err)
	}
	if flags&unix.O_ACCMODE != unix.O_RDONLY {
		return fmt.Errorf("cow: base %s is open for writing; open it O_RDONLY", f.Name())
	}
	return nil
}

// checkDistinct refuses an overlay that is the base's own file (through
// another descriptor, a hard link or a bind mount): writing it would
// write the image.
func checkDistinct(base, overlay *os.File) error {
	var b, o unix.Stat_t
	if err := unix.Fstat(int(base.Fd()), &b); err != nil {
		return fmt.Errorf("cow: base %s: %w", base.Name(), err)
	}
	if err := unix.Fstat(int(overlay.Fd()), &o); err != nil {
		return fmt.Errorf("cow: overlay %s: %w", overlay.Name(), err)
	}
	if b.Dev == o.Dev && b.Ino == o.Ino {
		return fmt.Errorf("cow: overlay %s is the base image %s itself", overlay.Name(), base.Name())
	}
	return nil
}

// loadMap reads the newest valid slot of overlay's map, or lays out a
// fresh overlay where none was ever committed. Only the slots' region,
// whose size comes from l, is read.
func loadMap(overlay *os.File, l layout, identity string) (slot, error) {
	info, err := overlay.Stat()
	if err != nil {
		return slot{}, err
	}
	if !info.Mode().IsRegular() {
		return slot{}, fmt.Errorf("not a regular file (%s)", info.Mode().Type())
	}
	if info.Size() == 0 {
		return initialize(overlay, l, identity)
	}
	region := make([]byte, 2*l.slotSize)
	if _, err := overlay.ReadAt(region, 0); err != nil && !errors.Is(err, io.EOF) {
		return slot{}, err
	}
	best, err := pickSlot(region, l, identity)
	if errors.Is(err, errEmpty) {
		// An interrupted first commit leaves the file at its full size
		// (initialize sets it first); a file of another size with no map
		// is someone else's, and is not truncated.
		if info.Size() != l.fileSize() {
			return slot{}, fmt.Errorf("no map, and %d bytes where an overlay of this base has %d: not an overlay", info.Size(), l.fileSize())
		}
		return initialize(overlay, l, identity)
	}
	if err != nil {
		return slot{}, err
	}
	if info.Size() < l.fileSize() {
		return slot{}, fmt.Errorf("%d bytes, shorter than the %d its map needs", info.Size(), l.fileSize())
	}
	return best, nil
}

// pickSlot returns the valid slot of the highest generation. With none,
// it says why: another base (ErrMismatch), never committed (errEmpty:
// slot 0 of zeros, slot 1 of zeros or an interrupted first commit), or
// corrupt.
func pickSlot(region []byte, l layout, identity string) (slot, error) {
	var best slot
	var errs [2]error
	for i := range 2 {
		s, err := decodeSlot(region[int64(i)*l.slotSize:int64(i+1)*l.slotSize], l, identity)
		errs[i] = err
		if err == nil && s.gen > best.gen {
			best = s
		}
	}
	switch {
	case best.gen > 0:
		return best, nil
	case errors.Is(errs[0], ErrMismatch):
		return slot{}, errs[0]
	case errors.Is(errs[1], ErrMismatch):
		return slot{}, errs[1]
	case errors.Is(errs[0], errEmpty) && firstCommitTorn(region[l.slotSize:], errs[1]):
		return slot{}, errEmpty
	}
	return slot{}, fmt.Errorf("no valid map slot (slot 0: %v; slot 1: %v)", errs[0], errs[1])
}

// firstCommitTorn reports whether slot 1, which holds generation 1, is
// empty or was being written when the first commit was cut short: it
// starts with the magic. Anything else is not an overlay of ours, and is
// never laid out afresh (which would truncate it).
func firstCommitTorn(slot1 []byte, err error) bool {
	return errors.Is(err, errEmpty) || string(slot1[:len(magic)]) == string(magic[:])
}

// initialize lays out a fresh overlay: the file cut to nothing (what the
// data region held was never committed) and grown to its size, then
// generation 1 of an empty map, synced.
func initialize(overlay *os.File, l layout, identity string) (slot, error) {
	if err := overlay.Truncate(0); err != nil {
		return slot{}, err
	}
	if err := overlay.Truncate(l.fileSize()); err != nil {
		return slot{}, err
	}
	first := slot{gen: 1, states: make([]byte, l.bitmapBytes)}
	buf := make([]byte, l.slotSize)
	encodeSlot(buf, l, first.gen, identity, first.states)
	if _, err := overlay.WriteAt(buf, l.slotOffset(first.gen)); err != nil {
		return slot{}, err
	}
	if err := unix.Fdatasync(int(overlay.Fd())); err != nil {
		return slot{}, fmt.Errorf("fdatasync: %w", err)
	}
	return first, nil
}
