package bundle

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"io"
	"time"
)

// identitySampleBytes is how much of each end of an image Identity hashes.
const identitySampleBytes = 1 << 20

// Identity identifies an image cheaply: its size, its modification time,
// and a SHA-256 of its first and last MiB, its partition table (kind,
// entries, GPT CRCs) and the superblock of each ext4 volume. Reading it
// costs about 2 MiB, whatever the image's size.
//
// It changes when the client replaces the image (a new bundle: another
// size, another mtime, another partition table or filesystem UUIDs) and
// when anything mounts and writes one of its filesystems in place (ext4
// updates its superblock's mount and write times, and the file's mtime
// moves). It does not change when the image is left alone, closed and
// reopened, or its bundle directory is renamed. A copy that does not keep
// the mtime (cp without -p) counts as a new image: that errs on the side
// of setting a profile's layer aside.
//
// What it misses, by design: an in-place edit of a block in the middle of
// the image that touches neither the first nor the last MiB nor a
// superblock, with the file's mtime forced back afterwards (touch -d), is
// not detected. Hashing the whole image (10 GB) at every start would catch
// it at the cost of a minute of disk reads; the client itself replaces
// images whole and checks their SHA-256 when it downloads them.
type Identity struct {
	Size    int64
	ModTime time.Time
	// Digest is the SHA-256 described above.
	Digest [sha256.Size]byte
}

// String is the identity as one string, stable across processes and
// reopens: "size=... mtime=... sha256=...".
func (id Identity) String() string {
	return fmt.Sprintf("size=%d mtime=%s sha256=%x", id.Size, id.ModTime.UTC().Format(time.RFC3339Nano), id.Digest)
}

// identify computes the Identity of the image r of size bytes, already
// inspected as img.
func identify(r io.ReaderAt, size int64, modTime time.Time, img Image) (Identity, error) {
	h := sha256.New()
	io.WriteString(h, "cowork-vmm image identity v1\n")
	head := min(size, identitySampleBytes)
	if err := hashRange(h, r, 0, head); err != nil {
		return Identity{}, err
	}
	tail := max(size-identitySampleBytes, 0)
	if err := hashRange(h, r, tail, size-tail); err != nil {
		return Identity{}, err
	}
	hashTable(h, img.Table)
	for _, v := range img.Volumes {
		if err := hashRange(h, r, v.Offset()+SuperblockOffset, SuperblockSize); err != nil {
			return Identity{}, err
		}
	}
	id := Identity{Size: size, ModTime: modTime}
	h.Sum(id.Digest[:0])
	return id, nil
}

// hashRange writes n bytes of r at off to h; a short read is an error.
func hashRange(h hash.Hash, r io.ReaderAt, off, n int64) error {
	got, err := io.Copy(h, io.NewSectionReader(r, off, n))
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("reading %d bytes at byte %d: %w", n, off, errShortImage)
	}
	return nil
}

// hashTable writes the table's kind, GPT CRCs and entries to h.
func hashTable(h hash.Hash, t Table) {
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	put(uint64(t.Kind))
	put(uint64(t.HeaderCRC))
	put(uint64(t.ArrayCRC))
	for _, p := range t.Partitions {
		put(uint64(p.Number))
		put(uint64(p.Start))
		put(uint64(p.Length))
		h.Write(p.Type[:])
		put(uint64(p.MBRType))
	}
}
