package arm64

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func testTreeConfig() DeviceTreeConfig {
	return DeviceTreeConfig{
		CPUs:        2,
		MemBytes:    512 << 20,
		Cmdline:     "console=ttyS0 panic=-1",
		InitrdStart: 0x9000_0000,
		InitrdEnd:   0x9012_3456,
		Virtio:      []MMIODevice{VirtioDevice(0), VirtioDevice(1), VirtioDevice(5)},
	}
}

func mustTree(t *testing.T, cfg DeviceTreeConfig) *fdtNode {
	t.Helper()
	b, err := DeviceTree(cfg)
	require.NoError(t, err)
	h, root, err := parseFDT(b)
	require.NoError(t, err)
	require.Zero(t, h.bootCPU)
	return root
}

func requireStr(t *testing.T, n *fdtNode, name, want string) {
	t.Helper()
	require.NotNil(t, n)
	got, err := n.str(name)
	require.NoError(t, err)
	require.Equal(t, want, got, "%s/%s", n.name, name)
}

func requireCells(t *testing.T, n *fdtNode, name string, want ...uint32) {
	t.Helper()
	require.NotNil(t, n)
	got, err := n.cells(name)
	require.NoError(t, err)
	require.Equal(t, want, got, "%s/%s", n.name, name)
}

func requireU64s(t *testing.T, n *fdtNode, name string, want ...uint64) {
	t.Helper()
	require.NotNil(t, n)
	got, err := n.u64s(name)
	require.NoError(t, err)
	require.Equal(t, want, got, "%s/%s", n.name, name)
}

func requireEmpty(t *testing.T, n *fdtNode, name string) {
	t.Helper()
	require.NotNil(t, n)
	v, ok := n.props[name]
	require.True(t, ok, "%s has no %s", n.name, name)
	require.Empty(t, v)
}

// TestDeviceTreeNodes decodes the tree with the test's own reader and
// checks every node and property the guest kernel relies on.
func TestDeviceTreeNodes(t *testing.T) {
	root := mustTree(t, testTreeConfig())
	require.Equal(t, []string{"chosen", "aliases", "memory@80000000", "cpus", "psci", "intc@3fff0000", "timer", "serial@9000000",
		"virtio_mmio@a000000", "virtio_mmio@a001000", "virtio_mmio@a005000"}, root.childNames())
	requireCells(t, root, "#address-cells", 2)
	requireCells(t, root, "#size-cells", 2)
	requireStr(t, root, "compatible", "linux,dummy-virt")
	requireCells(t, root, "interrupt-parent", gicPhandle)

	chosen := root.child("chosen")
	requireStr(t, chosen, "bootargs", "console=ttyS0 panic=-1")
	requireStr(t, chosen, "stdout-path", "/serial@9000000")
	requireU64s(t, chosen, "linux,initrd-start", 0x9000_0000)
	requireU64s(t, chosen, "linux,initrd-end", 0x9012_3456)
	require.NotContains(t, chosen.props, "rng-seed")
	require.NotContains(t, chosen.props, "kaslr-seed")
	requireStr(t, root.child("aliases"), "serial0", "/serial@9000000")

	mem := root.child("memory@80000000")
	requireStr(t, mem, "device_type", "memory")
	requireU64s(t, mem, "reg", 0x8000_0000, 512<<20)

	cpus := root.child("cpus")
	requireCells(t, cpus, "#address-cells", 1)
	requireCells(t, cpus, "#size-cells", 0)
	require.Equal(t, []string{"cpu@0", "cpu@1"}, cpus.childNames())
	for i, c := range cpus.children {
		requireStr(t, c, "device_type", "cpu")
		requireStr(t, c, "compatible", "arm,arm-v8")
		requireStr(t, c, "enable-method", "psci")
		requireCells(t, c, "reg", uint32(i))
	}
	requireStr(t, root.child("psci"), "compatible", "arm,psci-0.2")
	requireStr(t, root.child("psci"), "method", "hvc")

	gic := root.child("intc@3fff0000")
	requireStr(t, gic, "compatible", "arm,gic-v3")
	requireCells(t, gic, "#interrupt-cells", 3)
	requireCells(t, gic, "#address-cells", 2)
	requireEmpty(t, gic, "interrupt-controller")
	requireU64s(t, gic, "reg", 0x3FFF_0000, 0x1_0000, 0x3F7F_0000, 2*0x2_0000)
	requireCells(t, gic, "phandle", gicPhandle)

	timer := root.child("timer")
	requireStr(t, timer, "compatible", "arm,armv8-timer")
	requireCells(t, timer, "interrupts", 1, 13, 8, 1, 14, 8, 1, 11, 8, 1, 10, 8)
	requireEmpty(t, timer, "always-on")

	uart := root.child("serial@9000000")
	requireStr(t, uart, "compatible", "ns16550a")
	requireU64s(t, uart, "reg", 0x0900_0000, 0x1000)
	requireCells(t, uart, "interrupts", 0, 1, 1)
	requireCells(t, uart, "clock-frequency", 1843200)
	requireCells(t, uart, "reg-shift", 0)
	requireCells(t, uart, "reg-io-width", 1)

	for _, d := range []struct {
		name string
		base uint64
		spi  uint32
	}{{"virtio_mmio@a000000", 0x0A00_0000, 16}, {"virtio_mmio@a001000", 0x0A00_1000, 17}, {"virtio_mmio@a005000", 0x0A00_5000, 21}} {
		n := root.child(d.name)
		requireStr(t, n, "compatible", "virtio,mmio")
		requireU64s(t, n, "reg", d.base, 0x1000)
		requireCells(t, n, "interrupts", 0, d.spi, 1)
		requireEmpty(t, n, "dma-coherent")
	}
}

// TestDeviceTreeVariants checks what changes with the configuration: no
// initrd properties without an initrd, one cpu node per vCPU with KVM's
// MPIDR as reg, and the redistributor region sized for the vCPUs.
func TestDeviceTreeVariants(t *testing.T) {
	cfg := testTreeConfig()
	cfg.InitrdStart, cfg.InitrdEnd, cfg.Virtio, cfg.Cmdline = 0, 0, nil, ""
	cfg.CPUs = MaxCPUs
	root := mustTree(t, cfg)
	require.NotContains(t, root.child("chosen").props, "linux,initrd-start")
	require.NotContains(t, root.child("chosen").props, "linux,initrd-end")
	requireStr(t, root.child("chosen"), "bootargs", "")
	cpus := root.child("cpus").children
	require.Len(t, cpus, MaxCPUs)
	require.Equal(t, "cpu@f", cpus[15].name)
	require.Equal(t, "cpu@100", cpus[16].name)
	requireCells(t, cpus[16], "reg", 0x100)
	require.Equal(t, "cpu@30f", cpus[63].name)
	requireU64s(t, root.child("intc@3fff0000"), "reg", 0x3FFF_0000, 0x1_0000, 0x3F7F_0000, 0x80_0000)
	require.NotContains(t, strings.Join(root.childNames(), " "), "virtio")

	cfg.CPUs = 1
	cfg.Virtio = make([]MMIODevice, VirtioMMIOMaxDevices)
	for i := range cfg.Virtio {
		cfg.Virtio[i] = VirtioDevice(VirtioMMIOMaxDevices - 1 - i)
	}
	cfg.Cmdline = strings.Repeat("x", CmdlineMaxSize-1)
	root = mustTree(t, cfg)
	require.Len(t, root.children, 8+VirtioMMIOMaxDevices)
	require.Equal(t, "virtio_mmio@a01f000", root.children[8].name)
	requireStr(t, root.child("chosen"), "bootargs", cfg.Cmdline)
}

// TestDeviceTreeGICv2 checks the tree of a VM with a GICv2: the arm,gic
// binding's node with the distributor and the CPU interface, the timer's
// PPIs naming the vCPUs in their CPU mask, at most MaxCPUsGICv2 vCPUs; dtc
// decodes it without a warning.
func TestDeviceTreeGICv2(t *testing.T) {
	cfg := testTreeConfig()
	cfg.GIC = GICv2
	root := mustTree(t, cfg)
	gic := root.child("intc@3fff0000")
	requireStr(t, gic, "compatible", "arm,cortex-a15-gic")
	requireCells(t, gic, "#interrupt-cells", 3)
	requireEmpty(t, gic, "interrupt-controller")
	requireU64s(t, gic, "reg", 0x3FFF_0000, 0x1000, 0x3FFE_0000, 0x2000)
	requireCells(t, root.child("timer"), "interrupts", 1, 13, 0x308, 1, 14, 0x308, 1, 11, 0x308, 1, 10, 0x308)
	requireCells(t, root.child("serial@9000000"), "interrupts", 0, 1, 1)

	cfg.CPUs = MaxCPUsGICv2
	requireCells(t, mustTree(t, cfg).child("timer"), "interrupts", 1, 13, 0xff08, 1, 14, 0xff08, 1, 11, 0xff08, 1, 10, 0xff08)
	if dtc, err := exec.LookPath("dtc"); err == nil {
		require.Contains(t, decompile(t, dtc, cfg), "compatible = \"arm,cortex-a15-gic\";")
	}
	cfg.CPUs = MaxCPUsGICv2 + 1
	_, err := DeviceTree(cfg)
	require.ErrorIs(t, err, ErrBadDeviceTreeConfig)
	cfg.CPUs, cfg.GIC = 1, GIC(7)
	_, err = DeviceTree(cfg)
	require.ErrorIs(t, err, ErrBadDeviceTreeConfig)
}

// TestDeviceTreeRejectsBadConfig checks every configuration check.
func TestDeviceTreeRejectsBadConfig(t *testing.T) {
	cases := map[string]func(*DeviceTreeConfig){
		"no CPUs":           func(c *DeviceTreeConfig) { c.CPUs = 0 },
		"too many CPUs":     func(c *DeviceTreeConfig) { c.CPUs = MaxCPUs + 1 },
		"cmdline too long":  func(c *DeviceTreeConfig) { c.Cmdline = strings.Repeat("x", CmdlineMaxSize) },
		"NUL in cmdline":    func(c *DeviceTreeConfig) { c.Cmdline = "a\x00b" },
		"initrd below RAM":  func(c *DeviceTreeConfig) { c.InitrdStart = 0x1000 },
		"initrd past RAM":   func(c *DeviceTreeConfig) { c.InitrdEnd = RAMBase + c.MemBytes + 1 },
		"initrd empty":      func(c *DeviceTreeConfig) { c.InitrdEnd = c.InitrdStart },
		"initrd end only":   func(c *DeviceTreeConfig) { c.InitrdStart = 0 },
		"virtio below":      func(c *DeviceTreeConfig) { c.Virtio[0].Base = VirtioMMIOBase - VirtioMMIOSize },
		"virtio past":       func(c *DeviceTreeConfig) { c.Virtio[0] = VirtioDevice(VirtioMMIOMaxDevices) },
		"virtio unaligned":  func(c *DeviceTreeConfig) { c.Virtio[0].Base += 0x800 },
		"virtio SPI low":    func(c *DeviceTreeConfig) { c.Virtio[0].SPI = UARTSPI },
		"virtio SPI high":   func(c *DeviceTreeConfig) { c.Virtio[0].SPI = FirstVirtioSPI + VirtioMMIOMaxDevices },
		"virtio same base":  func(c *DeviceTreeConfig) { c.Virtio[1].Base = c.Virtio[0].Base },
		"virtio same SPI":   func(c *DeviceTreeConfig) { c.Virtio[1].SPI = c.Virtio[0].SPI },
		"too many virtio":   func(c *DeviceTreeConfig) { c.Virtio = make([]MMIODevice, VirtioMMIOMaxDevices+1) },
		"memory not 64 KiB": func(c *DeviceTreeConfig) { c.MemBytes += 0x1000 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := testTreeConfig()
			mutate(&cfg)
			b, err := DeviceTree(cfg)
			require.Error(t, err)
			if name == "memory not 64 KiB" {
				require.ErrorIs(t, err, ErrBadMemorySize)
			} else {
				require.ErrorIs(t, err, ErrBadDeviceTreeConfig)
			}
			require.Nil(t, b)
		})
	}
}

// TestDeviceTreeDTC decodes the tree with the reference compiler, dtc, and
// checks it parses without warnings and says what we meant.
func TestDeviceTreeDTC(t *testing.T) {
	dtc, err := exec.LookPath("dtc")
	if err != nil {
		t.Skip("dtc not installed (package device-tree-compiler): cannot cross-check the DTB")
	}
	big := testTreeConfig()
	big.CPUs, big.InitrdStart, big.InitrdEnd, big.Virtio = MaxCPUs, 0, 0, nil
	for i := range VirtioMMIOMaxDevices {
		big.Virtio = append(big.Virtio, VirtioDevice(i))
	}
	decompile(t, dtc, big) // no warnings with every vCPU and device either
	dts := decompile(t, dtc, testTreeConfig())
	for _, want := range []string{
		"/dts-v1/;",
		"compatible = \"linux,dummy-virt\";",
		"interrupt-parent = <0x01>;",
		"bootargs = \"console=ttyS0 panic=-1\";",
		"stdout-path = \"/serial@9000000\";",
		"linux,initrd-start = <0x00 0x90000000>;",
		"linux,initrd-end = <0x00 0x90123456>;",
		"memory@80000000 {",
		"reg = <0x00 0x80000000 0x00 0x20000000>;",
		"cpu@1 {",
		"enable-method = \"psci\";",
		"compatible = \"arm,psci-0.2\";",
		"method = \"hvc\";",
		"intc@3fff0000 {",
		"compatible = \"arm,gic-v3\";",
		"reg = <0x00 0x3fff0000 0x00 0x10000 0x00 0x3f7f0000 0x00 0x40000>;",
		"interrupts = <0x01 0x0d 0x08 0x01 0x0e 0x08 0x01 0x0b 0x08 0x01 0x0a 0x08>;",
		"always-on;",
		"compatible = \"ns16550a\";",
		"clock-frequency = <0x1c2000>;",
		"virtio_mmio@a005000 {",
		"interrupts = <0x00 0x15 0x01>;",
		"dma-coherent;",
	} {
		require.Contains(t, dts, want)
	}

	// Round trip: dtc recompiles its own output to the same tree.
	again := exec.Command(dtc, "-I", "dts", "-O", "dtb", "-o", "-")
	again.Stdin = strings.NewReader(dts)
	out, err := again.Output()
	require.NoError(t, err)
	_, root, err := parseFDT(out)
	require.NoError(t, err)
	want := mustTree(t, testTreeConfig())
	requireSameTree(t, want, root)
}

// decompile returns dtc's source for cfg's DTB, failing on any warning.
func decompile(t *testing.T, dtc string, cfg DeviceTreeConfig) string {
	t.Helper()
	b, err := DeviceTree(cfg)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "virt.dtb")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(dtc, "-I", "dtb", "-O", "dts", path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	require.Empty(t, stderr.String(), "dtc warnings")
	return stdout.String()
}

// requireSameTree compares two decoded trees, property values included.
func requireSameTree(t *testing.T, want, got *fdtNode) {
	t.Helper()
	require.Equal(t, want.name, got.name)
	require.Equal(t, want.sortedKeys(), got.sortedKeys(), want.name)
	for k, v := range want.props {
		require.Equal(t, v, got.props[k], "%s/%s", want.name, k)
	}
	require.Equal(t, want.childNames(), got.childNames(), want.name)
	for i := range want.children {
		requireSameTree(t, want.children[i], got.children[i])
	}
}
