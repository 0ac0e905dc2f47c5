package bundle

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// JournaledMarker is what MarkerPath holds in a DirtyJournalCopy once its
// journal is replayed, and Marker before. It has Marker's length: only the
// data block is journaled, the inode (and so the size) is not.
const JournaledMarker = "COWORK-VMM STAND-IN BUNDLE"

// DirtyJournalCopy copies the bundle into dir (sparse) and leaves the
// copy's root filesystem as a killed helper would: a committed journal
// transaction not yet replayed (needs_recovery), which rewrites
// MarkerPath's block to JournaledMarker. A kernel that mounts the copy
// replays it; one that ignored the journal would read Marker. The bundle
// itself is only read. Needs sfdisk and debugfs.
func (b Bundle) DirtyJournalCopy(dir string) (Bundle, error) {
	c := Bundle{Dir: dir}
	for _, name := range []string{RootImage, DataImage, InfoFile} {
		if err := copySparse(filepath.Join(b.Dir, name), filepath.Join(dir, name)); err != nil {
			return Bundle{}, err
		}
	}
	image := c.RootImagePath()
	_, parts, err := Partitions(image)
	if err != nil {
		return Bundle{}, err
	}
	root, ok := parts[RootPartition]
	if !ok {
		return Bundle{}, fmt.Errorf("%s has no partition %d", image, RootPartition)
	}
	if err := journalMarker(image, root.Start); err != nil {
		return Bundle{}, fmt.Errorf("dirtying %s's journal: %w", image, err)
	}
	return c, nil
}

// journalMarker writes a journal transaction replacing the first block of
// MarkerPath in the ext4 filesystem offset bytes into image, and checks
// that the filesystem then needs recovery.
func journalMarker(image string, offset int64) error {
	f, err := os.Open(image)
	if err != nil {
		return err
	}
	defer f.Close()
	sb, err := readExt4Superblock(f, offset)
	if err != nil {
		return err
	}
	out, err := debugfs(image, offset, "bmap "+MarkerPath+" 0")
	if err != nil {
		return err
	}
	block, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if err != nil || block == 0 {
		return fmt.Errorf("no block for %s (debugfs bmap: %q)", MarkerPath, out)
	}
	data := make([]byte, sb.BlockSize)
	copy(data, JournaledMarker+"\n")
	blockFile := image + ".journal-block"
	if err := os.WriteFile(blockFile, data, 0o600); err != nil {
		return err
	}
	defer os.Remove(blockFile)
	// jo, jw, jc: open the journal, commit one transaction, close it
	// without replaying.
	cmd := exec.Command("debugfs", "-w", "-f", "-", fsPath(image, offset))
	cmd.Stdin = strings.NewReader(fmt.Sprintf("jo\njw -b %d %s\njc\n", block, blockFile))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("debugfs -w: %w: %s", err, out)
	}
	if sb, err = readExt4Superblock(f, offset); err != nil {
		return err
	}
	if sb.Incompat&incompatRecover == 0 {
		return errors.New("debugfs left the journal clean")
	}
	return nil
}

// copySparse copies src to dst, leaving holes where src's 1 MiB chunks
// are all zeros, so a 1.1 GiB image costs what it holds.
func copySparse(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	return copyRangeSparse(src, dst, 0, fi.Size())
}

// copyRangeSparse copies length bytes of src from offset on into a new
// file dst. It reads only src's data (SEEK_DATA, SEEK_HOLE) and leaves
// holes for its holes and its all-zero chunks.
func copyRangeSparse(src, dst string, offset, length int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := copyDataSegments(out, in, offset, length); err != nil {
		out.Close()
		return err
	}
	if err := out.Truncate(length); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyDataSegments copies in's data segments between offset and
// offset+length to out, shifted back by offset; where the filesystem
// cannot tell data from holes, the whole range.
func copyDataSegments(out io.WriterAt, in *os.File, offset, length int64) error {
	end := offset + length
	fd := int(in.Fd())
	for pos := offset; pos < end; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // only a hole from pos on
			return nil
		}
		if err != nil { // no SEEK_DATA here: copy all of it
			return writeNonZeroChunks(out, io.NewSectionReader(in, pos, end-pos), pos-offset)
		}
		if data >= end {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		hole = min(hole, end)
		if err := writeNonZeroChunks(out, io.NewSectionReader(in, data, hole-data), data-offset); err != nil {
			return err
		}
		pos = hole
	}
	return nil
}

// writeNonZeroChunks writes r's chunks that are not all zeros in out, at
// their offsets in r plus base.
func writeNonZeroChunks(out io.WriterAt, r io.Reader, base int64) error {
	buf := make([]byte, 1<<20)
	zero := make([]byte, len(buf))
	off := base
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 && !bytes.Equal(buf[:n], zero[:n]) {
			if _, werr := out.WriteAt(buf[:n], off); werr != nil {
				return werr
			}
		}
		off += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
