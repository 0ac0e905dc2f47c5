package arm64

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/loader"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

const testMem = 512 << 20

func testBootConfig() BootConfig {
	return BootConfig{
		MemBytes: testMem,
		CPUs:     2,
		Kernel:   buildImage(defaultImage()),
		Initrd:   bytes.Repeat([]byte("initrd!"), 0x12345/7),
		Cmdline:  "console=ttyS0",
		Virtio:   []MMIODevice{VirtioDevice(0), VirtioDevice(1)},
	}
}

// bootTree decodes the DTB PrepareBoot wrote.
func bootTree(t *testing.T, mem *fakeMemory, s BootSetup) *fdtNode {
	t.Helper()
	dtb, err := mem.read(s.DTBAddr, int(s.DTBSize))
	require.NoError(t, err)
	_, root, err := parseFDT(dtb)
	require.NoError(t, err)
	return root
}

// TestPrepareBootPlacement checks where the kernel, initrd and DTB go,
// that each holds what was given, and that the DTB points at the initrd.
func TestPrepareBootPlacement(t *testing.T) {
	cfg := testBootConfig()
	mem := newFakeMemory(testMem)
	s, err := PrepareBoot(mem, cfg)
	require.NoError(t, err)

	initrdSize := uint64(len(cfg.Initrd))
	wantDTB := RAMBase + testMem - 2<<20
	require.Equal(t, BootSetup{
		Image:      ImageHeader{ImageSize: 0x30_0000, Flags: 0xa, PageSize: 4096, PlaceAnywhere: true},
		KernelAddr: RAMBase, KernelEnd: RAMBase + 0x30_0000, KernelEntry: RAMBase,
		DTBAddr: wantDTB, DTBSize: s.DTBSize,
		InitrdAddr: (wantDTB - initrdSize) &^ 0xffff, InitrdSize: initrdSize,
	}, s)
	require.Equal(t, BootRegisters{PC: 0x8000_0000, X0: wantDTB, PSTATE: 0x3c5}, s.Registers())
	require.Equal(t, [][2]uint64{
		{RAMBase, RAMBase + uint64(len(cfg.Kernel))},
		{s.InitrdAddr, s.InitrdAddr + initrdSize},
		{wantDTB, wantDTB + s.DTBSize},
	}, mem.written(), "kernel, initrd, DTB, and nothing else")

	kernel, err := mem.read(RAMBase, len(cfg.Kernel))
	require.NoError(t, err)
	require.Equal(t, cfg.Kernel, kernel)
	initrd, err := mem.read(s.InitrdAddr, len(cfg.Initrd))
	require.NoError(t, err)
	require.Equal(t, cfg.Initrd, initrd)

	root := bootTree(t, mem, s)
	chosen := root.child("chosen")
	requireU64s(t, chosen, "linux,initrd-start", s.InitrdAddr)
	requireU64s(t, chosen, "linux,initrd-end", s.InitrdAddr+initrdSize)
	requireStr(t, chosen, "bootargs", "console=ttyS0")
	requireU64s(t, root.child("memory@80000000"), "reg", RAMBase, testMem)
	require.Len(t, root.child("cpus").children, 2)
	require.NotNil(t, root.child("virtio_mmio@a001000"))
}

// TestPrepareBootLayouts checks placement across kernel offsets and RAM
// sizes: the kernel at RAMBase+text_offset, the DTB 8-byte aligned at the
// start of a 2 MiB block wholly in RAM and below RAMBase+32 GiB, the
// initrd 64 KiB-aligned between them.
func TestPrepareBootLayouts(t *testing.T) {
	cases := map[string]struct {
		mem        uint64
		textOffset uint64
		wantDTB    uint64
	}{
		"text_offset 0x80000": {testMem, 0x8_0000, RAMBase + testMem - 2<<20},
		"odd size":            {testMem + 0x1_0000, 0, RAMBase + testMem - 2<<20},
		"minimum RAM":         {MinRAM, 0, RAMBase + 2<<20},
		"64 GiB":              {64 << 30, 0, RAMBase + 32<<30 - 2<<20},
		"32 GiB":              {32 << 30, 0, RAMBase + 32<<30 - 2<<20},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := testBootConfig()
			spec := imageSpec{textOffset: c.textOffset, imageSize: 0x10_0000, flags: 0x2, body: 0x100}
			cfg.Kernel, cfg.MemBytes, cfg.Initrd = buildImage(spec), c.mem, []byte("tiny")
			mem := newFakeMemory(c.mem)
			s, err := PrepareBoot(mem, cfg)
			require.NoError(t, err)
			require.Equal(t, RAMBase+c.textOffset, s.KernelAddr)
			require.Equal(t, s.KernelAddr, s.Registers().PC)
			require.Equal(t, c.wantDTB, s.DTBAddr)
			require.Zero(t, s.DTBAddr%DTBMaxSize)
			require.LessOrEqual(t, s.DTBAddr+DTBMaxSize, RAMBase+c.mem)
			require.LessOrEqual(t, s.DTBAddr+DTBMaxSize, RAMBase+BootWindowSize)
			require.Zero(t, s.InitrdAddr%InitrdAlign)
			require.LessOrEqual(t, s.KernelEnd, s.InitrdAddr)
			require.LessOrEqual(t, s.InitrdAddr+s.InitrdSize, s.DTBAddr)
			bootTree(t, mem, s)
		})
	}
}

// countingSource is an InitrdSource that streams itself in small writes,
// as machine's file-backed initrd does.
type countingSource struct {
	data   []byte
	writes int
}

func (c *countingSource) Size() uint64 { return uint64(len(c.data)) }

func (c *countingSource) WriteTo(mem x86.GuestWriter, addr uint64) error {
	return loader.WriteStream(mem, addr, c.Size(), func(w io.Writer) error {
		for chunk := range slices.Chunk(c.data, 1000) {
			c.writes++
			if _, err := w.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestPrepareBootStreamsInitrd checks an InitrdSource is placed by its
// size and streamed in, winning over Initrd.
func TestPrepareBootStreamsInitrd(t *testing.T) {
	src := &countingSource{data: bytes.Repeat([]byte{0xab, 0xcd}, 5000)}
	cfg := testBootConfig()
	cfg.InitrdSource = src
	mem := newFakeMemory(testMem)
	s, err := PrepareBoot(mem, cfg)
	require.NoError(t, err)
	require.Equal(t, uint64(10000), s.InitrdSize)
	require.Equal(t, 10, src.writes)
	got, err := mem.read(s.InitrdAddr, 10000)
	require.NoError(t, err)
	require.Equal(t, src.data, got)
	requireU64s(t, bootTree(t, mem, s).child("chosen"), "linux,initrd-end", s.InitrdAddr+10000)

	cfg.InitrdSource, cfg.Initrd = nil, nil
	s, err = PrepareBoot(newFakeMemory(testMem), cfg)
	require.NoError(t, err)
	require.Zero(t, s.InitrdAddr)
	require.Zero(t, s.InitrdSize)
}

// TestPrepareBootRejects checks a configuration that cannot boot fails
// before anything is written to guest memory.
func TestPrepareBootRejects(t *testing.T) {
	cases := map[string]struct {
		mutate func(*BootConfig)
		want   error
	}{
		"no CPUs":         {func(c *BootConfig) { c.CPUs = 0 }, ErrBadDeviceTreeConfig},
		"cmdline":         {func(c *BootConfig) { c.Cmdline = string(make([]byte, CmdlineMaxSize)) }, ErrBadDeviceTreeConfig},
		"bad virtio":      {func(c *BootConfig) { c.Virtio = []MMIODevice{{Base: UARTBase, SPI: 16}} }, ErrBadDeviceTreeConfig},
		"memory size":     {func(c *BootConfig) { c.MemBytes = 1 << 20 }, ErrBadMemorySize},
		"not an Image":    {func(c *BootConfig) { c.Kernel = make([]byte, 4096) }, ErrBadImage},
		"empty source":    {func(c *BootConfig) { c.InitrdSource = &countingSource{} }, loader.ErrNoRoom},
		"initrd too big":  {func(c *BootConfig) { c.InitrdSource = &countingSource{data: make([]byte, testMem-3<<20)} }, loader.ErrNoRoom},
		"initrd ≥ window": {func(c *BootConfig) { c.InitrdSource = sizedSource(1 << 63) }, loader.ErrNoRoom},
		"kernel too big": {func(c *BootConfig) {
			c.Kernel = buildImage(imageSpec{imageSize: testMem - 2<<20 + 1, flags: 0xa})
		}, loader.ErrNoRoom},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := testBootConfig()
			c.mutate(&cfg)
			mem := newFakeMemory(testMem)
			_, err := PrepareBoot(mem, cfg)
			require.ErrorIs(t, err, c.want)
			require.Empty(t, mem.written())
		})
	}
}

// sizedSource claims a size and writes nothing.
type sizedSource uint64

func (s sizedSource) Size() uint64                        { return uint64(s) }
func (sizedSource) WriteTo(x86.GuestWriter, uint64) error { return nil }

// TestPrepareBootWriteErrors checks a failing guest memory is reported,
// wrapped, for the kernel.
func TestPrepareBootWriteErrors(t *testing.T) {
	_, err := PrepareBoot(failingMemory{}, testBootConfig())
	require.ErrorIs(t, err, errInjected)
	require.ErrorContains(t, err, "write kernel at 0x80000000")
}

// TestBootPSTATE checks the boot PSTATE is EL1h with DAIF masked.
func TestBootPSTATE(t *testing.T) {
	require.Equal(t, uint64(0x3c5), BootPSTATE)
}

// realImages returns the arm64 Images guest/kernel/build.sh cached:
// $KERNEL_CACHE/<flavour>/Image (default ~/.cache/cowork-vmm/kernels).
// builtPageSize is the page size the kernel config at path chose: 4 KiB
// for our guest and outer kernels, 16 KiB for the outer-16k-arm64 one.
func builtPageSize(t *testing.T, path string) uint64 {
	t.Helper()
	config, err := os.ReadFile(path)
	require.NoError(t, err, "the build's config beside its Image")
	for opt, size := range map[string]uint64{"CONFIG_ARM64_4K_PAGES=y": 4 << 10, "CONFIG_ARM64_16K_PAGES=y": 16 << 10, "CONFIG_ARM64_64K_PAGES=y": 64 << 10} {
		if bytes.Contains(config, []byte("\n"+opt+"\n")) {
			return size
		}
	}
	t.Fatalf("%s chooses no arm64 page size", path)
	return 0
}

func realImages(t *testing.T) []string {
	root := os.Getenv("KERNEL_CACHE")
	if root == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				t.Skipf("no home directory: %v", err)
			}
			cache = filepath.Join(home, ".cache")
		}
		root = filepath.Join(cache, "cowork-vmm", "kernels")
	}
	matches, _ := filepath.Glob(filepath.Join(root, "*", "Image"))
	var found []string
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil && fi.Mode().IsRegular() {
			found = append(found, m)
		}
	}
	if len(found) == 0 {
		t.Skipf("no arm64 Image under %s (the guest-arm64 kernel build makes guest-arm64-current/Image)", root)
	}
	return found
}

// TestPrepareBootRealImage parses each arm64 Image the project built and
// prepares its boot into a sparse 512 MiB guest.
func TestPrepareBootRealImage(t *testing.T) {
	for _, path := range realImages(t) {
		t.Run(filepath.Base(filepath.Dir(path)), func(t *testing.T) {
			image, err := os.ReadFile(path)
			require.NoError(t, err)
			h, err := ParseImageHeader(image)
			require.NoError(t, err)
			t.Logf("%s: %d bytes, %+v", path, len(image), h)
			require.True(t, h.PlaceAnywhere, "a 6.1 kernel may be placed anywhere")
			require.Equal(t, builtPageSize(t, filepath.Join(filepath.Dir(path), "config")), h.PageSize)
			require.Zero(t, h.TextOffset, "text_offset is 0 since v5.8")
			cfg := testBootConfig()
			cfg.Kernel = image
			mem := newFakeMemory(testMem)
			s, err := PrepareBoot(mem, cfg)
			require.NoError(t, err)
			require.Equal(t, RAMBase, s.KernelEntry)
			bootTree(t, mem, s)
		})
	}
}
