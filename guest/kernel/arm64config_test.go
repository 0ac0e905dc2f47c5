package kernel

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBuiltARM64Configs: each built arm64 kernel has what our arm64 VMM
// (GICv3, arch timer, PSCI, the DT's 16550, virtio-mmio, /dev/mem) or the
// arm64 harness (KVM at EL2, 9p, PL011) needs, and every option its
// fragments set, the last fragment winning, as build.sh merges them. Each
// flavour skips when it is not built.
func TestBuiltARM64Configs(t *testing.T) {
	common := []string{"CONFIG_ARM64", "CONFIG_ARM_GIC_V3", "CONFIG_ARM_ARCH_TIMER", "CONFIG_ARM_PSCI_FW",
		"CONFIG_VIRTIO_MMIO", "CONFIG_SERIAL_AMBA_PL011_CONSOLE", "CONFIG_NET_9P_VIRTIO"}
	for _, tc := range []struct {
		flavour   string
		fragments []string
		want      map[string]string
	}{
		{GuestARM64, []string{"guest.fragment", "guest-only.fragment", "arm64.fragment", "guest-only-arm64.fragment"},
			map[string]string{"CONFIG_SERIAL_8250_CONSOLE": "y", "CONFIG_SERIAL_OF_PLATFORM": "y", "CONFIG_DEVMEM": "y",
				"CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES": "y", "CONFIG_VIRTIO_VSOCKETS": "y", "CONFIG_VIRTIO_FS": "y",
				"CONFIG_HZ": "250", "CONFIG_RANDOMIZE_BASE": "n", "CONFIG_MODULES": "n", "CONFIG_PCI": "n",
				"CONFIG_ARM64_4K_PAGES": "y"}},
		{OuterARM64, []string{"guest.fragment", "outer-kvm.fragment", "arm64.fragment", "outer-kvm-arm64.fragment"},
			map[string]string{"CONFIG_VIRTUALIZATION": "y", "CONFIG_KVM": "y", "CONFIG_TUN": "y", "CONFIG_VETH": "y",
				"CONFIG_DEBUG_FS_ALLOW_ALL": "y", "CONFIG_TRANSPARENT_HUGEPAGE_MADVISE": "y", "CONFIG_ARM64_4K_PAGES": "y"}},
		{OuterARM64Pages16K, []string{"guest.fragment", "outer-kvm.fragment", "arm64.fragment", "outer-kvm-arm64.fragment", "outer-16k-arm64.fragment"},
			map[string]string{"CONFIG_KVM": "y", "CONFIG_ARM64_16K_PAGES": "y", "CONFIG_ARM64_4K_PAGES": "n"}},
	} {
		t.Run(tc.flavour, func(t *testing.T) {
			path, err := FindImage(tc.flavour, "config")
			if err != nil {
				t.Skipf("no built %s kernel to check: %v", tc.flavour, err)
			}
			config := readConfig(t, path)
			for _, opt := range common {
				assert.Equal(t, "y", config[opt], "%s in %s", opt, path)
			}
			for opt, want := range tc.want {
				assert.Equal(t, want, valueOrN(config, opt), "%s in %s", opt, path)
			}
			want, mayDrop := mergeFragments(t, tc.fragments)
			for opt, value := range want {
				if mayDrop[opt] {
					continue
				}
				assert.Equal(t, value, valueOrN(config, opt), "%s (fragments %v) in %s", opt, tc.fragments, path)
			}
		})
	}
}

// valueOrN is opt's value in config, "n" when unset or absent.
func valueOrN(config map[string]string, opt string) string {
	if v, ok := config[opt]; ok {
		return v
	}
	return "n"
}

// mergeFragments is what fragments set, the last one winning, and the
// options their "# allow-drop:" lines let Kconfig drop.
func mergeFragments(t *testing.T, fragments []string) (want map[string]string, mayDrop map[string]bool) {
	t.Helper()
	want, mayDrop = map[string]string{}, map[string]bool{}
	for _, fragment := range fragments {
		for opt, value := range readConfig(t, fragment) {
			want[opt] = value
		}
		f, err := os.Open(fragment)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if opts, ok := strings.CutPrefix(sc.Text(), "# allow-drop: "); ok {
				for _, opt := range strings.Fields(opts) {
					mayDrop[opt] = true
				}
			}
		}
		require.NoError(t, sc.Err())
		f.Close()
	}
	return want, mayDrop
}
