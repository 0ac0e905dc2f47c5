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

func TestGuestFor(t *testing.T) {
	for _, tc := range []struct{ goarch, flavour, boot string }{
		{"amd64", Guest, "vmlinux"},
		{"arm64", GuestARM64, "Image"},
	} {
		flavour, boot, err := GuestFor(tc.goarch)
		require.NoError(t, err, tc.goarch)
		require.Equal(t, tc.flavour, flavour, tc.goarch)
		require.Equal(t, tc.boot, boot, tc.goarch)
	}
	_, _, err := GuestFor("riscv64")
	require.ErrorContains(t, err, `GOARCH "riscv64"`)
}

// An arm64 build caches Image (no bzImage): FindGuest("arm64") and
// Find(GuestARM64) must find it, not look for a vmlinux of the x86 guest.
func TestFindARM64Kernels(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("KERNEL_CACHE", cache)
	for _, flavour := range []string{GuestARM64, OuterARM64} {
		build := filepath.Join(cache, flavour+"-0123456789abcdef")
		require.NoError(t, os.MkdirAll(build, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(build, "Image"), []byte("MZ"), 0o644))
		require.NoError(t, os.Symlink(filepath.Base(build), filepath.Join(cache, flavour+"-current")))
	}

	p, err := FindGuest("arm64")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(cache, "guest-arm64-current", "Image"), p)
	p, err = Find(OuterARM64)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(cache, "outer-arm64-current", "Image"), p)

	// The x86 guest is not built in this cache: amd64 must not take the
	// arm64 kernel.
	_, err = FindGuest("amd64")
	require.ErrorContains(t, err, "no guest kernel built")

	_, err = FindImage(GuestARM64, "bzImage")
	require.ErrorContains(t, err, `builds no "bzImage"`)
	_, err = FindImage(Guest, "Image")
	require.ErrorContains(t, err, `builds no "Image"`)
	_, err = FindImage(GuestARM64, "../guest-current/vmlinux")
	require.ErrorContains(t, err, "builds no")
}

func TestFindARM64ExplainsHowToBuild(t *testing.T) {
	t.Setenv("KERNEL_CACHE", t.TempDir())
	_, err := Find(GuestARM64)
	require.ErrorContains(t, err, "`make kernel-arm64`")
	require.ErrorContains(t, err, "gcc-aarch64-linux-gnu")
	_, err = Find(OuterARM64)
	require.ErrorContains(t, err, "`make kernel-outer-arm64`")
	_, err = FindGuest("arm64")
	require.ErrorContains(t, err, "guest-arm64-current/Image")
}
