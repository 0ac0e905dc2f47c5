package arm64

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDeviceTree builds trees from arbitrary configurations: DeviceTree
// never panics, refuses with a typed error, and what it builds decodes
// strictly and says what was asked (command line, vCPUs, devices, RAM).
func FuzzDeviceTree(f *testing.F) {
	f.Add(2, uint64(512<<20), "console=ttyS0", uint64(0x9000_0000), uint64(0x9000_1000), []byte{0, 16, 1, 17}, 0)
	f.Add(MaxCPUs, MinRAM, "", uint64(0), uint64(0), []byte{31, 47}, 0)
	f.Add(1, MaxRAM, "a\x00b", uint64(RAMBase), uint64(RAMBase+1), []byte{0, 16, 0, 17}, 0)
	f.Add(MaxCPUsGICv2, uint64(512<<20), "", uint64(0), uint64(0), []byte{0, 16}, int(GICv2))
	f.Fuzz(func(t *testing.T, cpus int, mem uint64, cmdline string, initrdStart, initrdEnd uint64, devices []byte, gic int) {
		cfg := DeviceTreeConfig{CPUs: cpus, GIC: GIC(gic), MemBytes: mem, Cmdline: cmdline, InitrdStart: initrdStart, InitrdEnd: initrdEnd}
		for i := 0; i+1 < len(devices) && i < 2*(VirtioMMIOMaxDevices+1); i += 2 {
			cfg.Virtio = append(cfg.Virtio, MMIODevice{
				Base: VirtioMMIOBase + uint64(devices[i])*VirtioMMIOSize/2, // odd values: unaligned
				SPI:  uint32(devices[i+1]),
			})
		}
		b, err := DeviceTree(cfg)
		if err != nil {
			require.True(t, errors.Is(err, ErrBadDeviceTreeConfig) || errors.Is(err, ErrBadMemorySize), "%v", err)
			return
		}
		require.LessOrEqual(t, uint64(len(b)), DTBMaxSize)
		_, root, err := parseFDT(b)
		require.NoError(t, err)
		requireStr(t, root.child("chosen"), "bootargs", cmdline)
		require.Len(t, root.child("cpus").children, cpus)
		require.Len(t, root.children, 8+len(cfg.Virtio))
		requireU64s(t, root.child("memory@80000000"), "reg", RAMBase, mem)
	})
}

// FuzzFDTWriterNames feeds arbitrary node and property names and values:
// the writer either refuses them with ErrFDT or writes a blob that decodes
// back to the same names and value.
func FuzzFDTWriterNames(f *testing.F) {
	f.Add("cpu@0", "reg", []byte{0, 0, 0, 1})
	f.Add("a@", "#x", []byte(nil))
	f.Add("0bad", "a b", []byte("x"))
	f.Fuzz(func(t *testing.T, node, prop string, value []byte) {
		w := newFDTWriter()
		w.BeginNode("")
		w.BeginNode(node)
		w.Property(prop, value)
		w.EndNode()
		w.EndNode()
		b, err := w.Finish(0)
		if err != nil {
			require.ErrorIs(t, err, ErrFDT)
			require.Error(t, errors.Join(checkNodeName(node), checkPropertyName(prop)), "refused valid names: %v", err)
			return
		}
		require.NoError(t, checkNodeName(node))
		_, root, err := parseFDT(b)
		require.NoError(t, err)
		require.Equal(t, []string{node}, root.childNames())
		require.Equal(t, normalize(map[string][]byte{prop: value}), normalize(root.children[0].props))
	})
}

// normalize maps empty values to nil so a nil and an empty value compare
// equal.
func normalize(props map[string][]byte) map[string][]byte {
	for k, v := range props {
		if len(v) == 0 {
			props[k] = nil
		}
	}
	return props
}
