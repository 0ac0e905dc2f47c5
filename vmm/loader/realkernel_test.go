package loader

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// realKernels returns the kernel images guest/kernel/build.sh cached:
// $KERNEL_CACHE/<flavour>-<hash>/{vmlinux,bzImage} (default
// ${XDG_CACHE_HOME:-~/.cache}/cowork-vmm/kernels). Build trees under the
// cache are not searched: a kernel mid-link there is not an image.
func realKernels(t *testing.T) []string {
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
	var found []string
	for _, name := range []string{"vmlinux", "bzImage"} {
		matches, _ := filepath.Glob(filepath.Join(root, "*", name))
		for _, m := range matches {
			if strings.Contains(filepath.Base(filepath.Dir(m)), "-arm64") {
				continue // this loader boots x86-64 kernels; vmm/arm64 tests those
			}
			if fi, err := os.Stat(m); err == nil && fi.Mode().IsRegular() {
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
		t.Run(filepath.Base(filepath.Dir(path))+"/"+filepath.Base(path), func(t *testing.T) {
			image, err := os.ReadFile(path)
			require.NoError(t, err)
			mem := newSparseMemory(memBytes)
			k, err := LoadKernel(mem, memBytes, image)
			require.NoError(t, err)
			t.Logf("%s: %v, load [%#x, %#x), entry64 %#x, PVH entry %#x", path, k.Format, k.LoadAddr, k.LoadEnd, k.Entry64, k.PVHEntry)
			require.GreaterOrEqual(t, k.LoadAddr, x86.HighMemStart)
			require.Less(t, k.Entry64, k.LoadEnd)
			require.GreaterOrEqual(t, k.Entry64, k.LoadAddr)
			flavour := filepath.Base(filepath.Dir(path))
			if k.Format == FormatELF && strings.HasPrefix(flavour, "guest") {
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
