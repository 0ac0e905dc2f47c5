package kernel

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel/embedded"
)

// Env overrides where the guest kernel comes from (the path of a vmlinux
// on x86-64, an arm64 Image on arm64).
const Env = "COWORK_VMM_KERNEL"

// BesideExecutable are the names of a guest kernel shipped next to the
// helper's executable.
var BesideExecutable = []string{"vmlinux", "cowork-vmm-vmlinux"}

// Why Locate found no usable kernel; its errors wrap one of these.
var (
	ErrOverrideUnusable = errors.New("the guest kernel named by " + Env + " (or --kernel) is unusable")
	ErrEmbeddedDamaged  = errors.New("the guest kernel embedded in this binary is damaged")
	ErrBesideUnusable   = errors.New("the guest kernel beside the executable is unusable")
	ErrNone             = errors.New("no guest kernel found")
)

// Fix is what to do when no kernel is found.
const Fix = "build one with `make kernel` in the cowork-vmm repository (then `make build` embeds it in the binary), " +
	"or set " + Env + " to a kernel guest/kernel/build.sh built (a vmlinux on x86-64, an Image on arm64)"

// Image is a located kernel: a file, or the bytes themselves.
type Image struct {
	Path  string
	Bytes []byte
	// From says where it was found, for logs and errors.
	From string
}

// Sources are the places a guest kernel may come from, tried in this
// order by Locate. Functions, so tests and doctor can fake a host.
type Sources struct {
	// Override is --kernel or $COWORK_VMM_KERNEL; when set it must exist.
	Override string
	// Embedded is the kernel compiled into the binary (embedded.ErrNotEmbedded
	// when there is none); nil skips it.
	Embedded func() (Image, error)
	// Executable is the helper's own path ("" if unknown).
	Executable string
	// Cache is the latest `make kernel` build for this binary's arch
	// (FindGuest(runtime.GOARCH)); nil skips it.
	Cache func() (string, error)
	// Stat defaults to os.Stat.
	Stat func(string) (fs.FileInfo, error)
}

// DefaultSources are the real host's: the override (or $COWORK_VMM_KERNEL),
// the given embedded source, beside executable, and the build cache.
func DefaultSources(override, executable string, embedded func() (Image, error)) Sources {
	if override == "" {
		override = os.Getenv(Env)
	}
	return Sources{Override: override, Embedded: embedded, Executable: executable,
		Cache: func() (string, error) { return FindGuest(runtime.GOARCH) }}
}

// Locate finds the guest kernel, in order: the override, the embedded
// kernel, vmlinux or cowork-vmm-vmlinux beside the executable, the build
// cache. Its errors wrap ErrOverrideUnusable, ErrEmbeddedDamaged,
// ErrBesideUnusable or ErrNone, and say how to get a kernel.
func Locate(src Sources) (Image, error) {
	stat := src.Stat
	if stat == nil {
		stat = os.Stat
	}
	if src.Override != "" {
		if err := regularFile(stat, src.Override); err != nil {
			return Image{}, fmt.Errorf("%w: %w", ErrOverrideUnusable, err)
		}
		return Image{Path: src.Override, From: "from " + Env + " (or --kernel): " + src.Override}, nil
	}
	var tried []string
	if src.Embedded != nil {
		k, err := src.Embedded()
		switch {
		case err == nil:
			return k, nil
		case !errors.Is(err, embedded.ErrNotEmbedded):
			return Image{}, fmt.Errorf("%w (rebuild it, or set %s): %w", ErrEmbeddedDamaged, Env, err)
		}
		tried = append(tried, "not embedded in this binary")
	}
	if src.Executable != "" {
		dir := filepath.Dir(src.Executable)
		for _, name := range BesideExecutable {
			p := filepath.Join(dir, name)
			err := regularFile(stat, p)
			if err == nil {
				return Image{Path: p, From: "beside the executable: " + p}, nil
			}
			if !errors.Is(err, fs.ErrNotExist) {
				return Image{}, fmt.Errorf("%w: %w", ErrBesideUnusable, err)
			}
			tried = append(tried, "no "+p)
		}
	}
	if src.Cache != nil {
		p, err := src.Cache()
		if err == nil {
			return Image{Path: p, From: "in the build cache: " + p}, nil
		}
		tried = append(tried, err.Error())
	}
	return Image{}, fmt.Errorf("%w (%s): %s", ErrNone, strings.Join(tried, "; "), Fix)
}

// regularFile checks that p is a regular file (symlinks followed).
func regularFile(stat func(string) (fs.FileInfo, error), p string) error {
	info, err := stat(p)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", p)
	}
	return nil
}
