package bundle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requirePartitions is Partitions, skipping without sfdisk.
func requirePartitions(t *testing.T, image string) (string, map[int]Partition) {
	t.Helper()
	label, parts, err := Partitions(image)
	if err != nil && strings.Contains(err.Error(), "is needed") {
		t.Skip(err.Error())
	}
	require.NoError(t, err)
	return label, parts
}

// run is debugfs's output, skipping without debugfs.
func run(t *testing.T, image string, offset int64, request string) string {
	t.Helper()
	out, err := debugfs(image, offset, request)
	if err != nil && strings.Contains(err.Error(), "is needed") {
		t.Skip(err.Error())
	}
	require.NoError(t, err)
	return out
}

// cat is the file at path in the filesystem offset bytes into image.
func cat(t *testing.T, image string, offset int64, path string) string {
	t.Helper()
	return run(t, image, offset, "cat "+path)
}

func TestBuiltBundleLayout(t *testing.T) {
	b := Require(t)
	image := b.RootImagePath()
	label, parts := requirePartitions(t, image)
	require.Equal(t, "gpt", label)
	require.Len(t, parts, 3, "partitions %v", parts)
	for n, typ := range map[int]string{RootPartition: TypeLinuxFilesystem, BIOSPartition: TypeBIOSBoot, ESPPartition: TypeEFISystem} {
		require.Contains(t, parts, n)
		assert.Equal(t, typ, parts[n].Type, "partition %d's type", n)
	}
	// As in Ubuntu's cloud images, 14 and 15 come first on disk.
	assert.Less(t, parts[BIOSPartition].Start, parts[ESPPartition].Start)
	assert.Less(t, parts[ESPPartition].Start, parts[RootPartition].Start)
	assert.EqualValues(t, 4<<20, parts[BIOSPartition].Size)

	f, err := os.Open(image)
	require.NoError(t, err)
	defer f.Close()
	rootOffset := parts[RootPartition].Start
	sb, err := readExt4Superblock(f, rootOffset)
	require.NoError(t, err)
	assert.Equal(t, RootLabel, sb.Label)
	assert.Zero(t, sb.Incompat&incompatRecover, "a clean journal")
	boot := make([]byte, SectorSize)
	_, err = f.ReadAt(boot, parts[ESPPartition].Start)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x55, 0xAA}, boot[510:], "the ESP holds a FAT boot sector")
	assert.Contains(t, string(boot), fmt.Sprintf("%-11s", ESPLabel))

	data, err := os.Open(b.DataImagePath())
	require.NoError(t, err)
	defer data.Close()
	sb, err = readExt4Superblock(data, 0)
	require.NoError(t, err)
	assert.Equal(t, DataLabel, sb.Label)
	assert.Equal(t, DataMarker+"\n", cat(t, b.DataImagePath(), 0, DataMarkerPath))

	checkRootContents(t, image, rootOffset)
}

// checkRootContents checks what the root filesystem holds that the host
// does not, and its fstab, network names and user.
func checkRootContents(t *testing.T, image string, offset int64) {
	_, err := os.Stat(MarkerPath)
	require.ErrorIs(t, err, os.ErrNotExist, "the host has the bundle's marker: tests could not tell the two apart")

	assert.Equal(t, Marker+"\n", cat(t, image, offset, MarkerPath))
	tool := cat(t, image, offset, ToolPath)
	assert.True(t, strings.HasPrefix(tool, "#!/bin/sh\n"), "tool: %q", tool)
	assert.Contains(t, tool, strings.SplitN(ToolOutput, "\n", 2)[0])
	assert.Regexp(t, `Type: regular +Mode: +0755 `, run(t, image, offset, "stat "+ToolPath))
	assert.Contains(t, cat(t, image, offset, "/usr/lib/python3/dist-packages/"+PythonModule+".py"), Marker)

	fstab := strings.Fields(strings.ReplaceAll(cat(t, image, offset, "/etc/fstab"), "\n", " ; "))
	assert.Subset(t, fstab, []string{"LABEL=" + RootLabel, "/", "ext4"})
	assert.Contains(t, strings.Join(fstab, " "), "LABEL="+DataLabel+" "+DataMountPoint+" ext4")

	assert.Equal(t, Hostname+"\n", cat(t, image, offset, "/etc/hostname"))
	assert.Regexp(t, `(?m)^127\.0\.1\.1\s+`+Hostname+`$`, cat(t, image, offset, "/etc/hosts"))
	assert.NotContains(t, cat(t, image, offset, "/etc/resolv.conf"), "nameserver", "the host's DNS server")

	passwd := cat(t, image, offset, "/etc/passwd")
	assert.Contains(t, passwd, fmt.Sprintf("\n%s:x:%d:%d:", User, UserID, UserID))
	// mkfs.ext4 -d kept sudo's set-uid bit (the image's own sudo).
	assert.Regexp(t, `Type: regular +Mode: +04755 `, run(t, image, offset, "stat /usr/bin/sudo"))
	for _, bin := range []string{"/usr/bin/python3", "/usr/bin/git", "/usr/bin/sudo", "/usr/bin/apt-get", "/usr/bin/pip3"} {
		// python3 is a symlink (to python3.11): stat, not cat.
		assert.Regexp(t, `Type: (regular|symlink) `, run(t, image, offset, "stat "+bin), "%s in the image", filepath.Base(bin))
	}
}
