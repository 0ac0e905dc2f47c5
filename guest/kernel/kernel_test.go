package kernel

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFindBuiltKernel(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("KERNEL_CACHE", cache)
	build := filepath.Join(cache, "guest-0123456789abcdef")
	require.NoError(t, os.MkdirAll(build, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(build, "vmlinux"), []byte("ELF"), 0o644))
	require.NoError(t, os.Symlink("guest-0123456789abcdef", filepath.Join(cache, "guest-current")))

	p, err := Find(Guest)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(cache, "guest-current", "vmlinux"), p)

	_, err = FindImage(Guest, "bzImage")
	require.ErrorContains(t, err, "make kernel")
}

func TestFindExplainsHowToBuild(t *testing.T) {
	t.Setenv("KERNEL_CACHE", t.TempDir())
	_, err := Find(Outer)
	require.ErrorContains(t, err, "make kernel-outer")
	_, err = Find(Guest)
	require.ErrorContains(t, err, "make kernel")
	_, err = Find("bogus")
	require.ErrorContains(t, err, "flavour")
}

func TestCacheDirDefault(t *testing.T) {
	t.Setenv("KERNEL_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	dir, err := CacheDir()
	require.NoError(t, err)
	require.Equal(t, "/xdg/cowork-vmm/kernels", dir)
}
