package bundle

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrNotImage says a file has neither a partition table nor an ext4
// filesystem at its start: not a disk image this package reads (a
// manifest, a compressed download, a kernel).
var ErrNotImage = errors.New("not a disk image (no partition table, no ext4 filesystem)")

// Volume is one ext4 filesystem of an image: a partition's, or the whole
// file's when the image has no partition table.
type Volume struct {
	// Partition is the table entry it lies in; for an image without a
	// table, Number is 0 and Start/Length cover the whole file.
	Partition Partition
	// FS is its validated superblock.
	FS Filesystem
}

// Offset and Length are the byte range of the image the block layer
// serves for this volume: exactly the partition (or the whole file).
func (v Volume) Offset() int64 { return v.Partition.Start }

// Length is the partition's length in bytes; for a whole-file volume it is
// the file's size, which need not be a multiple of SectorSize.
func (v Volume) Length() int64 { return v.Partition.Length }

// Describe names the volume for logs: "partition 1" or "the whole file".
func (v Volume) Describe() string {
	if v.Partition.Number == 0 {
		return "the whole file"
	}
	return fmt.Sprintf("partition %d", v.Partition.Number)
}

// Image is one disk image of a bundle, read and validated.
type Image struct {
	// Path is the file's path as opened.
	Path string
	// Size is the file's size in bytes.
	Size  int64
	Table Table
	// Volumes are its ext4 filesystems, in partition order.
	Volumes []Volume
	// Problems name the partitions whose ext4 superblock is invalid
	// ("partition 3: ext4 superblock checksum mismatch ..."); they are not
	// among Volumes.
	Problems []string
	// Identity changes when the file is replaced; see Identity.
	Identity Identity
}

// Inspect reads the image open in f (read-only is enough): its partition
// table, the ext4 superblock of each partition (or of the whole file), and
// its Identity. Errors begin with the file's name. A file that is not a
// disk image at all gives an error wrapping ErrNotImage.
func Inspect(f *os.File) (Image, error) {
	st, err := f.Stat()
	if err != nil {
		return Image{}, err
	}
	if !st.Mode().IsRegular() {
		return Image{}, fmt.Errorf("%s: not a regular file (%s)", f.Name(), st.Mode().Type())
	}
	img, err := inspect(f, st.Size())
	if err != nil {
		return Image{}, fmt.Errorf("%s: %w", f.Name(), err)
	}
	img.Path = f.Name()
	img.Identity, err = identify(f, st.Size(), st.ModTime(), img)
	if err != nil {
		return Image{}, fmt.Errorf("%s: identity: %w", f.Name(), err)
	}
	return img, nil
}

// inspect reads the table and the volumes of the image r of size bytes.
func inspect(r io.ReaderAt, size int64) (Image, error) {
	img := Image{Size: size}
	table, err := ReadTable(r, size)
	if err != nil {
		if size < 2*SectorSize {
			return Image{}, notRawError(r, size)
		}
		return Image{}, err
	}
	img.Table = table
	regions := table.Partitions
	if table.Kind == TableNone {
		regions = []Partition{{Start: 0, Length: size}}
	}
	for _, p := range regions {
		fs, err := ReadSuperblock(r, p.Start, p.Length)
		switch {
		case err == nil:
			img.Volumes = append(img.Volumes, Volume{Partition: p, FS: fs})
		case errors.Is(err, ErrNotExt4):
		default:
			img.Problems = append(img.Problems, fmt.Sprintf("%s: %v", Volume{Partition: p}.Describe(), err))
		}
	}
	if table.Kind == TableNone && len(img.Volumes) == 0 && len(img.Problems) == 0 {
		return Image{}, notRawError(r, size)
	}
	return img, nil
}
