package bundle

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// threeWay is a GPT with a small partition labelled lbl1, a middle one of
// type Linux root and a large plain one.
func threeWay(lbl1 string, rootType GUID) testGPT {
	return testGPT{sectors: 8192, entries: 128, parts: []testPartition{
		{number: 1, typ: LinuxFilesystem, first: 2048, last: 2559, sb: partSB(lbl1, 2048, 2559)},
		{number: 2, typ: rootType, first: 2560, last: 3999, sb: partSB("other", 2560, 3999)},
		{number: 3, typ: LinuxFilesystem, first: 4000, last: 8000, sb: partSB("data", 4000, 8000)},
	}}
}

func selectRootOf(t *testing.T, data []byte) (Root, error) {
	t.Helper()
	img, err := inspectFile(t, writeImage(t, t.TempDir(), RootImageName, data))
	require.NoError(t, err)
	return SelectRoot(img)
}

func TestRootSelection(t *testing.T) {
	cases := map[string]struct {
		disk      []byte
		number    int
		offset    int64
		length    int64
		label     string
		reasonHas string
	}{
		"by label": {threeWay(RootLabel, LinuxRootX86_64).build(t), 1, 2048 * 512, 512 * 512, RootLabel,
			`partition 1 of rootfs.img: ext4 labelled "cloudimg-rootfs"`},
		"by type GUID": {threeWay("boot", nativeRoot).build(t), 2, 2560 * 512, 1440 * 512, "other",
			"partition 2 of rootfs.img: no ext4 labelled \"cloudimg-rootfs\"; partition type " + guidNames[nativeRoot]},
		"by size": {threeWay("boot", LinuxFilesystem).build(t), 3, 4000 * 512, 4001 * 512, "data",
			"the largest of 3 ext4 partitions (2048512 bytes"},
		"cloud layout": {cloudLayout(RootLabel).build(t), 1, 256 * 512, 3745 * 512, RootLabel, "ext4 labelled"},
		"MBR by size": {testMBRDisk(4096,
			testPartition{number: 1, mbrType: 0x83, first: 2, last: 999, sb: partSB("small", 2, 999)},
			testPartition{number: 2, mbrType: 0x83, first: 1000, last: 4095, sb: partSB("big", 1000, 4095)},
		), 2, 1000 * 512, 3096 * 512, "big", "the largest of 2 ext4 partitions"},
		"MBR by label": {testMBRDisk(4096,
			testPartition{number: 1, mbrType: 0x83, first: 2, last: 999, sb: partSB(RootLabel, 2, 999)},
			testPartition{number: 2, mbrType: 0x83, first: 1000, last: 4095, sb: partSB("big", 1000, 4095)},
		), 1, 2 * 512, 998 * 512, RootLabel, "ext4 labelled"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			root, err := selectRootOf(t, c.disk)
			require.NoError(t, err)
			assert.Equal(t, c.number, root.Partition.Number)
			assert.Equal(t, c.offset, root.Offset())
			assert.Equal(t, c.length, root.Length())
			assert.Equal(t, c.label, root.FS.Label)
			assert.Equal(t, "deadbeef-0102-0304-0506-0708090a0b0c", root.FS.UUID)
			assert.True(t, root.FS.HasJournal)
			assert.False(t, root.FS.NeedsRecovery)
			assert.Contains(t, root.Reason, c.reasonHas)
		})
	}
}

func TestBareExt4IsItsOwnRoot(t *testing.T) {
	disk := make([]byte, 1<<20)
	copy(disk[SuperblockOffset:], ext4SB("bare", 1<<20).bytes())
	root, err := selectRootOf(t, disk)
	require.NoError(t, err)
	assert.Equal(t, 0, root.Partition.Number)
	assert.Equal(t, int64(0), root.Offset())
	assert.Equal(t, int64(1<<20), root.Length())
	assert.Equal(t, "bare", root.FS.Label)
	assert.Contains(t, root.Reason, `the whole file of rootfs.img: the image has no partition table and is one ext4 filesystem (label "bare")`)
}

func TestDirtyJournalIsReported(t *testing.T) {
	g := cloudLayout(RootLabel)
	g.parts[2].sb.incompat |= IncompatRecover
	root, err := selectRootOf(t, g.build(t))
	require.NoError(t, err)
	assert.True(t, root.FS.NeedsRecovery)
	assert.Contains(t, root.Reason, "its journal needs recovery")
}

// TestSuperblockLargerThanPartition: partition 1 claims more than it
// holds; it is skipped (and said so), and partition 2 is the root.
func TestSuperblockLargerThanPartition(t *testing.T) {
	g := threeWay(RootLabel, LinuxRootX86_64)
	g.parts[0].sb.blocks = 100000
	root, err := selectRootOf(t, g.build(t))
	require.NoError(t, err)
	assert.Equal(t, 2, root.Partition.Number)
	assert.Contains(t, root.Reason, "skipped partition 1: ext4 superblock claims 100000 blocks of 1024 bytes, larger than its partition of 262144 bytes")
}

func TestNoExt4Partition(t *testing.T) {
	g := cloudLayout(RootLabel)
	g.parts[2].sb = nil
	_, err := selectRootOf(t, g.build(t))
	require.True(t, errors.Is(err, ErrNoExt4), "%v", err)
	assert.Contains(t, err.Error(), "rootfs.img: no ext4 partition (GPT table with partitions 1 (Linux filesystem), 14 (BIOS boot), 15 (EFI system))")
}

func TestSuperblockChecks(t *testing.T) {
	good := ext4SB(RootLabel, 1<<20)
	badCsum := good.bytes()
	badCsum[offVolumeName] = 'X'
	bigBlocks := good
	bigBlocks.logBlockSize = 7
	journalDev := good
	journalDev.incompat |= IncompatJournalDev
	big64 := good
	big64.incompat |= Incompat64Bit
	big64.blocks = 1<<32 + 1
	for name, c := range map[string]struct {
		sb   []byte
		want string
	}{
		"checksum":       {badCsum, "ext4 superblock checksum mismatch"},
		"block size":     {bigBlocks.bytes(), "block size 2^(10+7)"},
		"journal device": {journalDev.bytes(), "an external journal device"},
		"64-bit too big": {big64.bytes(), "claims 4294967297 blocks of 1024 bytes"},
		"not ext4":       {make([]byte, SuperblockSize), "no ext4 superblock"},
		"short":          {good.bytes()[:100], "100 bytes, want 1024"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseSuperblock(c.sb, 1<<20)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	fs, err := ParseSuperblock(good.bytes(), 1<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), fs.Bytes())
	assert.Equal(t, uint32(1024), fs.BlockSize)
}

func TestRootLogValue(t *testing.T) {
	root, err := selectRootOf(t, cloudLayout(RootLabel).build(t))
	require.NoError(t, err)
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("root", "root", root)
	line := buf.String()
	for _, want := range []string{"root.partition=1", "root.offset=131072", "root.length=1917440",
		"root.label=cloudimg-rootfs", "root.needsRecovery=false", `root.reason="partition 1 of rootfs.img: ext4 labelled`} {
		assert.Contains(t, line, want)
	}
}

// TestRootReasonSaysTheBackupGPTWasUsed: doctor and the log say that the
// primary GPT was bad.
func TestRootReasonSaysTheBackupGPTWasUsed(t *testing.T) {
	disk := cloudLayout(RootLabel).build(t)
	disk[SectorSize+40] ^= 0xFF
	root, err := selectRootOf(t, disk)
	require.NoError(t, err)
	assert.Equal(t, 1, root.Partition.Number)
	assert.Contains(t, root.Reason, "primary GPT (LBA 1) is bad: header CRC mismatch")
	assert.Contains(t, root.Reason, "the backup at LBA 4095 is used")
}

// TestClientSizedImage: the client's layout at its real size and offsets
// (10 GiB, sparse; partition 14 at LBA 2048, 15 at 10240, 1 at 227328 to
// the end, 4 KiB blocks), so that 64-bit offsets and the identity's last
// MiB are exercised at scale.
func TestClientSizedImage(t *testing.T) {
	const sectors = 10 << 30 / SectorSize
	rootSB := ext4SB(RootLabel, 0)
	rootSB.logBlockSize = 2
	rootSB.blocks = (sectors - 34 - 227328) * SectorSize / 4096
	g := testGPT{sectors: sectors, entries: 128, parts: []testPartition{
		{number: 14, typ: BIOSBoot, first: 2048, last: 10239},
		{number: 15, typ: EFISystem, first: 10240, last: 227327},
		{number: 1, typ: LinuxFilesystem, first: 227328, last: sectors - 34, sb: &rootSB},
	}}
	dir := t.TempDir()
	g.writeSparse(t, filepath.Join(dir, RootImageName))
	b, err := Read(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(227328*SectorSize), b.Root.Offset())
	assert.Equal(t, int64(sectors-34-227328+1)*SectorSize, b.Root.Length())
	assert.Equal(t, uint32(4096), b.Root.FS.BlockSize)
	assert.Equal(t, int64(10<<30), b.RootImage.Identity.Size)
}

// TestRootTypeIsTheGuestArchitecturesOwn: an arm64 helper takes the ARM-64
// root partition, not the x86-64 one, and the other way round.
func TestRootTypeIsTheGuestArchitecturesOwn(t *testing.T) {
	img, err := inspectFile(t, writeImage(t, t.TempDir(), RootImageName, threeWay("boot", LinuxRootARM64).build(t)))
	require.NoError(t, err)
	v, why := chooseRoot(img.Volumes, LinuxRootARM64)
	require.Equal(t, 2, v.Partition.Number, why)
	require.Contains(t, why, LinuxRootARM64Name)
	v, why = chooseRoot(img.Volumes, LinuxRootX86_64)
	require.Equal(t, 3, v.Partition.Number, "an x86-64 helper ignores an ARM-64 root: %s", why)
}
