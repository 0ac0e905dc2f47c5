package kernel

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/cowork-vmm/cowork-vmm/internal/cachedir"
)

// Flavours the build script knows.
const (
	Guest      = "guest"       // the x86-64 kernel our VMM boots
	Outer      = "outer"       // the x86-64 nested-harness kernel (KVM on AMD SVM)
	GuestARM64 = "guest-arm64" // the arm64 kernel our VMM boots
	OuterARM64 = "outer-arm64" // the arm64 nested-harness kernel (KVM at EL2, VHE)
	// OuterARM64Pages16K is OuterARM64 with 16 KiB pages, as Apple Silicon
	// under Asahi Linux and Raspberry Pi OS on a Raspberry Pi 5 run.
	OuterARM64Pages16K = "outer-16k-arm64"
)

// flavour is what build.sh produces for one flavour.
type flavour struct {
	// boot is the file a VMM loads (Find's answer).
	boot string
	// files are the files of a build FindImage may be asked for.
	files []string
	// build is the make target that builds it.
	build string
	// deps are the apt packages build.sh needs for it.
	deps string
}

const x86Deps = "linux-source-6.1 bc flex bison libelf-dev libssl-dev cpio"

// describe says what build.sh makes of a flavour (ok false: not one).
func describe(name string) (f flavour, ok bool) {
	x86 := []string{"vmlinux", "bzImage", "config"}
	arm64 := []string{"Image", "vmlinux", "config"}
	arm64Deps := x86Deps + " (and gcc-aarch64-linux-gnu on a host that is not arm64)"
	switch name {
	case Guest:
		return flavour{boot: "vmlinux", files: x86, build: "make kernel", deps: x86Deps}, true
	case Outer:
		return flavour{boot: "vmlinux", files: x86, build: "make kernel-outer", deps: x86Deps}, true
	case GuestARM64:
		return flavour{boot: "Image", files: arm64, build: "make kernel-arm64", deps: arm64Deps}, true
	case OuterARM64:
		return flavour{boot: "Image", files: arm64, build: "make kernel-outer-arm64", deps: arm64Deps}, true
	case OuterARM64Pages16K:
		return flavour{boot: "Image", files: arm64, build: "make kernel-outer-16k-arm64", deps: arm64Deps}, true
	}
	return flavour{}, false
}

// GuestFor is the guest kernel flavour for a helper built for goarch (a
// GOARCH value) and the file of that build our VMM boots: "guest" and
// "vmlinux" on amd64, "guest-arm64" and "Image" on arm64.
func GuestFor(goarch string) (flavourName, bootFile string, err error) {
	var name string
	switch goarch {
	case "amd64":
		name = Guest
	case "arm64":
		name = GuestARM64
	default:
		return "", "", fmt.Errorf("no guest kernel flavour for GOARCH %q: cowork-vmm runs on amd64 and arm64", goarch)
	}
	f, _ := describe(name)
	return name, f.boot, nil
}

// FindGuest returns the path of the latest built guest kernel for goarch
// (pass runtime.GOARCH for this binary's own): Find of GuestFor's flavour.
func FindGuest(goarch string) (string, error) {
	name, _, err := GuestFor(goarch)
	if err != nil {
		return "", err
	}
	return Find(name)
}

// CacheDir is where build.sh puts kernels: $KERNEL_CACHE, else
// $XDG_CACHE_HOME/cowork-vmm/kernels, else $HOME/.cache/cowork-vmm/kernels.
func CacheDir() (string, error) { return cachedir.Dir("KERNEL_CACHE", "kernels") }

// Find returns the path of the latest build of flavour (Guest, Outer,
// GuestARM64 or OuterARM64), the file a VMM boots: vmlinux on x86-64,
// Image on arm64. When none is built the error says how to build one.
func Find(flavourName string) (string, error) {
	f, ok := describe(flavourName)
	if !ok {
		return "", unknownFlavour(flavourName)
	}
	return FindImage(flavourName, f.boot)
}

// FindImage is Find for another file of the build: "vmlinux", "bzImage"
// or "config" of an x86-64 flavour; "Image", "vmlinux" or "config" of an
// arm64 one.
func FindImage(flavourName, image string) (string, error) {
	f, ok := describe(flavourName)
	if !ok {
		return "", unknownFlavour(flavourName)
	}
	if !slices.Contains(f.files, image) {
		return "", fmt.Errorf("kernel flavour %q builds no %q: want one of %q", flavourName, image, f.files)
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, flavourName+"-current", image)
	info, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("no %s kernel built (looked for %s): run `%s` in the cowork-vmm repository (needs apt packages %s; ~5 min on 2 cores)", flavourName, p, f.build, f.deps)
		}
		return "", fmt.Errorf("kernel %s: %w", p, err)
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("kernel %s is not a regular file", p)
	}
	return p, nil
}

func unknownFlavour(name string) error {
	return fmt.Errorf("kernel flavour %q: want %q, %q, %q, %q or %q", name, Guest, Outer, GuestARM64, OuterARM64, OuterARM64Pages16K)
}
