package bundle

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
)

// SectorSize is the sector size of the bundle's GPT.
const SectorSize = 512

// Partition is one partition of a disk image as sfdisk reads it: an
// oracle independent of the product's own partition-table parser.
type Partition struct {
	Start int64  // bytes from the start of the image
	Size  int64  // bytes
	Type  string // the GPT type GUID, upper case
}

// Partitions returns image's partition-table label ("gpt", "dos") and its
// partitions by number, read with `sfdisk --json` (package fdisk).
func Partitions(image string) (string, map[int]Partition, error) {
	sfdisk, err := exec.LookPath("sfdisk")
	if err != nil {
		return "", nil, fmt.Errorf("sfdisk (package fdisk) is needed to read %s's partition table: %w", image, err)
	}
	out, err := exec.Command(sfdisk, "--json", image).Output()
	if err != nil {
		return "", nil, fmt.Errorf("sfdisk --json %s: %w", image, err)
	}
	var table struct {
		PartitionTable struct {
			Label      string `json:"label"`
			SectorSize int64  `json:"sectorsize"`
			Partitions []struct {
				Node  string `json:"node"`
				Start int64  `json:"start"` // sectors
				Size  int64  `json:"size"`  // sectors
				Type  string `json:"type"`
			} `json:"partitions"`
		} `json:"partitiontable"`
	}
	if err := json.Unmarshal(out, &table); err != nil {
		return "", nil, fmt.Errorf("sfdisk --json %s: %w", image, err)
	}
	pt := table.PartitionTable
	if pt.SectorSize != SectorSize {
		return "", nil, fmt.Errorf("%s: sector size %d, want %d", image, pt.SectorSize, SectorSize)
	}
	parts := map[int]Partition{}
	for _, p := range pt.Partitions {
		// sfdisk names partition N of a file "<file>N".
		n, err := strconv.Atoi(strings.TrimPrefix(p.Node, image))
		if err != nil {
			return "", nil, fmt.Errorf("%s: partition node %q: %w", image, p.Node, err)
		}
		parts[n] = Partition{Start: p.Start * SectorSize, Size: p.Size * SectorSize, Type: strings.ToUpper(p.Type)}
	}
	return pt.Label, parts, nil
}

// ext4Superblock is what the tests read of an ext4 superblock.
type ext4Superblock struct {
	Label     string
	BlockSize int64
	Incompat  uint32 // s_feature_incompat
}

const (
	incompatRecover = 0x4  // the journal needs replaying
	incompatExtents = 0x40 // ext4, not ext2 or ext3
)

// readExt4Superblock reads the superblock 1024 bytes into the filesystem
// at offset in r, checking its magic and the extents feature.
func readExt4Superblock(r io.ReaderAt, offset int64) (ext4Superblock, error) {
	sb := make([]byte, 1024)
	if _, err := r.ReadAt(sb, offset+1024); err != nil {
		return ext4Superblock{}, err
	}
	if magic := binary.LittleEndian.Uint16(sb[0x38:]); magic != 0xEF53 {
		return ext4Superblock{}, fmt.Errorf("no ext superblock at %d: magic %#x", offset, magic)
	}
	s := ext4Superblock{
		Label:    strings.TrimRight(string(sb[0x78:0x88]), "\x00"),
		Incompat: binary.LittleEndian.Uint32(sb[0x60:]),
	}
	if s.Incompat&incompatExtents == 0 {
		return ext4Superblock{}, fmt.Errorf("the filesystem at %d has no extents: not ext4", offset)
	}
	logBlockSize := binary.LittleEndian.Uint32(sb[0x18:])
	if logBlockSize > 6 { // 64 KiB, ext4's largest
		return ext4Superblock{}, fmt.Errorf("the filesystem at %d claims a block size of 1024<<%d", offset, logBlockSize)
	}
	s.BlockSize = 1024 << logBlockSize
	return s, nil
}

// debugfs runs one debugfs request (such as "cat /etc/fstab") on the ext4
// filesystem offset bytes into image and returns its output. debugfs
// reports a missing file on stderr with status 0: callers compare the
// output.
func debugfs(image string, offset int64, request string) (string, error) {
	bin, err := exec.LookPath("debugfs")
	if err != nil {
		return "", fmt.Errorf("debugfs (package e2fsprogs) is needed to read files in %s: %w", image, err)
	}
	out, err := exec.Command(bin, "-R", request, fsPath(image, offset)).Output()
	if err != nil {
		return "", fmt.Errorf("debugfs -R %q %s: %w", request, image, err)
	}
	return string(out), nil
}

// fsPath names the filesystem offset bytes into image for e2fsprogs' tools.
func fsPath(image string, offset int64) string {
	return fmt.Sprintf("%s?offset=%d", image, offset)
}
