package loader

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// realKernels returns kernel images built by the guest kernel script,
// under ~/.cache/cowork-vmm/kernels (any depth up to two directories).
func realKernels(t *testing.T) []string {
	home, err := os.UserHomeDir()
	if err != nil {
		t.Skipf("no home directory: %v", err)
	}
	root := filepath.Join(home, ".cache", "cowork-vmm", "kernels")
	var found []string
	for _, pattern := range []string{"*", "*/*", "*/*/*"} {
		matches, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, m := range matches {
			base := filepath.Base(m)
			if fi, err := os.Stat(m); err == nil && fi.Mode().IsRegular() &&
				(base == "vmlinux" || base == "bzImage" || strings.HasPrefix(base, "vmlinux-") || strings.HasPrefix(base, "bzImage-")) {
				found = append(found, m)
			}
		}
	}
	if len(found) == 0 {
		t.Skipf("no built kernel under %s (make kernel builds one)", root)
	}
	return found
}

// TestLoadRealKernel loads each kernel the project built and prepares both
// boot paths into a sparse 512 MiB guest.
func TestLoadRealKernel(t *testing.T) {
	const memBytes = 512 << 20
	for _, path := range realKernels(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			image, err := os.ReadFile(path)
			require.NoError(t, err)
			mem := newSparseMemory(memBytes)
			k, err := LoadKernel(mem, memBytes, image)
			require.NoError(t, err)
			t.Logf("%s: %v, load [%#x, %#x), entry64 %#x, PVH entry %#x", path, k.Format, k.LoadAddr, k.LoadEnd, k.Entry64, k.PVHEntry)
			require.GreaterOrEqual(t, k.LoadAddr, x86.HighMemStart)
			require.Less(t, k.Entry64, k.LoadEnd)
			require.GreaterOrEqual(t, k.Entry64, k.LoadAddr)
			if k.Format == FormatELF {
				require.NotZero(t, k.PVHEntry, "our guest kernel is built with CONFIG_PVH")
			}
			setup, err := PrepareBoot(newSparseMemory(memBytes), BootConfig{
				MemBytes: memBytes, CPUs: 2, Kernel: image, Initrd: []byte("07070100"), Cmdline: "console=ttyS0",
				PVH: k.PVHEntry != 0,
			})
			require.NoError(t, err)
			require.GreaterOrEqual(t, setup.InitrdAddr, k.LoadEnd)
		})
	}
}
