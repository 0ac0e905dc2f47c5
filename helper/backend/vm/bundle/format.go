package bundle

import (
	"bytes"
	"fmt"
	"io"
)

// Magic numbers of files a bundle may hold that are not raw disks: other
// disk image formats (which this package cannot read: an error that says
// which), and compressed downloads (not images: left out, but named when
// the root image is one).
var (
	otherDiskFormats = []struct{ name, magic string }{
		{"qcow2", "QFI\xfb"},
		{"VHDX", "vhdxfile"},
		{"VMDK", "KDMV"},
		{"VMDK", "# Disk DescriptorFile"},
		{"VDI", "<<< Oracle VM VirtualBox Disk Image >>>"},
	}
	compressedFormats = []struct{ name, magic string }{
		{"zstd", "\x28\xb5\x2f\xfd"},
		{"xz", "\xfd7zXZ\x00"},
		{"gzip", "\x1f\x8b"},
	}
)

// notRawError says why r, with no partition table and no ext4 at its
// start, is not a raw disk image: another disk format (an error to
// report), or not an image at all (wrapping ErrNotImage, with the
// compression it has if it is a known one).
func notRawError(r io.ReaderAt, size int64) error {
	var head [64]byte
	n, _ := r.ReadAt(head[:min(size, int64(len(head)))], 0)
	for _, f := range otherDiskFormats {
		if bytes.HasPrefix(head[:n], []byte(f.magic)) {
			return fmt.Errorf("a %s image, not a raw disk image (convert it with qemu-img convert -O raw)", f.name)
		}
	}
	for _, f := range compressedFormats {
		if bytes.HasPrefix(head[:n], []byte(f.magic)) {
			return fmt.Errorf("%w: %s-compressed", ErrNotImage, f.name)
		}
	}
	return ErrNotImage
}
