package kernel

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cowork-vmm/cowork-vmm/internal/cachedir"
)

// Flavours the build script knows.
const (
	Guest = "guest"
	Outer = "outer"
)

// CacheDir is where build.sh puts kernels: $KERNEL_CACHE, else
// $XDG_CACHE_HOME/cowork-vmm/kernels, else $HOME/.cache/cowork-vmm/kernels.
func CacheDir() (string, error) { return cachedir.Dir("KERNEL_CACHE", "kernels") }

// Find returns the path of the latest built vmlinux of flavour ("guest" or
// "outer"). When none is built the error says how to build one.
func Find(flavour string) (string, error) {
	return FindImage(flavour, "vmlinux")
}

// FindImage is Find for another file of the build: "vmlinux", "bzImage" or
// "config".
func FindImage(flavour, image string) (string, error) {
	if flavour != Guest && flavour != Outer {
		return "", fmt.Errorf("kernel flavour %q: want %q or %q", flavour, Guest, Outer)
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, flavour+"-current", image)
	info, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("no %s kernel built (looked for %s): run `%s` in the cowork-vmm repository (needs apt packages linux-source-6.1 bc flex bison libelf-dev libssl-dev cpio; ~5 min on 2 cores)", flavour, p, buildCommand(flavour))
		}
		return "", fmt.Errorf("kernel %s: %w", p, err)
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("kernel %s is not a regular file", p)
	}
	return p, nil
}

func buildCommand(flavour string) string {
	if flavour == Outer {
		return "make kernel-outer"
	}
	return "make kernel"
}
