package bundle

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sectorSize = 512

// gptPartition is one partition as `sfdisk --json` prints it.
type gptPartition struct {
	Node  string `json:"node"`
	Start int64  `json:"start"` // sectors
	Size  int64  `json:"size"`  // sectors
	Type  string `json:"type"`
}

// readPartitionTable runs sfdisk --json on image and returns its label
// ("gpt") and partitions by number.
func readPartitionTable(t *testing.T, image string) (string, map[int]gptPartition) {
	t.Helper()
	sfdisk, err := exec.LookPath("sfdisk")
	if err != nil {
		t.Skip("sfdisk (package fdisk) is needed to read the bundle's partition table")
	}
	out, err := exec.Command(sfdisk, "--json", image).Output()
	require.NoError(t, err, "sfdisk --json %s", image)
	var table struct {
		PartitionTable struct {
			Label      string         `json:"label"`
			SectorSize int64          `json:"sectorsize"`
			Partitions []gptPartition `json:"partitions"`
		} `json:"partitiontable"`
	}
	require.NoError(t, json.Unmarshal(out, &table))
	require.EqualValues(t, sectorSize, table.PartitionTable.SectorSize)
	parts := map[int]gptPartition{}
	for _, p := range table.PartitionTable.Partitions {
		n, err := strconv.Atoi(strings.TrimPrefix(p.Node, image))
		require.NoError(t, err, "partition node %q", p.Node)
		parts[n] = p
	}
	return table.PartitionTable.Label, parts
}

// ext4Label reads the superblock at offset (1024 bytes into the
// filesystem) and returns its volume label, after checking the magic and
// the extents feature that makes it ext4 rather than ext2.
func ext4Label(f *os.File, offset int64) (string, error) {
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, offset+1024); err != nil {
		return "", err
	}
	if magic := binary.LittleEndian.Uint16(sb[0x38:]); magic != 0xEF53 {
		return "", fmt.Errorf("no ext superblock at %d: magic %#x", offset, magic)
	}
	const incompatExtents = 0x40
	if binary.LittleEndian.Uint32(sb[0x60:])&incompatExtents == 0 {
		return "", fmt.Errorf("the filesystem at %d has no extents: not ext4", offset)
	}
	return strings.TrimRight(string(sb[0x78:0x88]), "\x00"), nil
}

// debugfs runs the debugfs request (such as "cat /etc/fstab") on the ext4
// filesystem starting offset bytes into image and returns its output.
func debugfs(t *testing.T, image string, offset int64, request string) string {
	t.Helper()
	bin, err := exec.LookPath("debugfs")
	if err != nil {
		t.Skip("debugfs (package e2fsprogs) is needed to read files in the bundle's images")
	}
	// debugfs reports a missing file on stderr with status 0: the caller's
	// comparison of the output catches it.
	out, err := exec.Command(bin, "-R", request, fmt.Sprintf("%s?offset=%d", image, offset)).Output()
	require.NoError(t, err, "debugfs -R %q", request)
	return string(out)
}

// debugfsCat returns the file at path inside the filesystem.
func debugfsCat(t *testing.T, image string, offset int64, path string) string {
	t.Helper()
	return debugfs(t, image, offset, "cat "+path)
}

func TestBuiltBundleLayout(t *testing.T) {
	b := Require(t)
	image := b.RootImagePath()
	label, parts := readPartitionTable(t, image)
	require.Equal(t, "gpt", label)
	require.Len(t, parts, 3, "partitions %v", parts)
	for n, typ := range map[int]string{RootPartition: TypeLinuxFilesystem, BIOSPartition: TypeBIOSBoot, ESPPartition: TypeEFISystem} {
		require.Contains(t, parts, n)
		assert.Equal(t, typ, parts[n].Type, "partition %d's type", n)
	}
	// As in Ubuntu's cloud images, 14 and 15 come first on disk.
	assert.Less(t, parts[BIOSPartition].Start, parts[ESPPartition].Start)
	assert.Less(t, parts[ESPPartition].Start, parts[RootPartition].Start)
	assert.EqualValues(t, 4<<20, parts[BIOSPartition].Size*sectorSize)

	f, err := os.Open(image)
	require.NoError(t, err)
	defer f.Close()
	rootOffset := parts[RootPartition].Start * sectorSize
	got, err := ext4Label(f, rootOffset)
	require.NoError(t, err)
	assert.Equal(t, RootLabel, got)
	boot := make([]byte, sectorSize)
	_, err = f.ReadAt(boot, parts[ESPPartition].Start*sectorSize)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x55, 0xAA}, boot[510:], "the ESP holds a FAT boot sector")
	assert.Contains(t, string(boot), fmt.Sprintf("%-11s", ESPLabel))

	data, err := os.Open(b.DataImagePath())
	require.NoError(t, err)
	defer data.Close()
	got, err = ext4Label(data, 0)
	require.NoError(t, err)
	assert.Equal(t, DataLabel, got)
	assert.Equal(t, DataMarker+"\n", debugfsCat(t, b.DataImagePath(), 0, DataMarkerPath))

	checkRootContents(t, image, rootOffset)
}

// checkRootContents checks what the root filesystem holds that the host
// does not, and its fstab and user.
func checkRootContents(t *testing.T, image string, offset int64) {
	_, err := os.Stat(MarkerPath)
	require.ErrorIs(t, err, os.ErrNotExist, "the host has the bundle's marker: tests could not tell the two apart")

	assert.Equal(t, Marker+"\n", debugfsCat(t, image, offset, MarkerPath))
	tool := debugfsCat(t, image, offset, ToolPath)
	assert.True(t, strings.HasPrefix(tool, "#!/bin/sh\n"), "tool: %q", tool)
	assert.Contains(t, tool, strings.SplitN(ToolOutput, "\n", 2)[0])
	assert.Regexp(t, `Type: regular +Mode: +0755 `, debugfs(t, image, offset, "stat "+ToolPath))
	assert.Contains(t, debugfsCat(t, image, offset, "/usr/lib/python3/dist-packages/"+PythonModule+".py"), Marker)

	fstab := strings.Fields(strings.ReplaceAll(debugfsCat(t, image, offset, "/etc/fstab"), "\n", " ; "))
	assert.Subset(t, fstab, []string{"LABEL=" + RootLabel, "/", "ext4"})
	assert.Contains(t, strings.Join(fstab, " "), "LABEL="+DataLabel+" "+DataMountPoint+" ext4")

	assert.Equal(t, Hostname+"\n", debugfsCat(t, image, offset, "/etc/hostname"))
	assert.Regexp(t, `(?m)^127\.0\.1\.1\s+`+Hostname+`$`, debugfsCat(t, image, offset, "/etc/hosts"))
	assert.NotContains(t, debugfsCat(t, image, offset, "/etc/resolv.conf"), "nameserver", "the host's DNS server")

	passwd := debugfsCat(t, image, offset, "/etc/passwd")
	assert.Contains(t, passwd, fmt.Sprintf("\n%s:x:%d:%d:", User, UserID, UserID))
	for _, bin := range []string{"/usr/bin/python3", "/usr/bin/git", "/usr/bin/sudo", "/usr/bin/apt-get", "/usr/bin/pip3"} {
		// python3 is a symlink (to python3.11): stat, not cat.
		assert.Regexp(t, `Type: (regular|symlink) `, debugfs(t, image, offset, "stat "+bin), "%s in the image", filepath.Base(bin))
	}
}
