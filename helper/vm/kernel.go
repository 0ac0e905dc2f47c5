package vm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel/embedded"
)

// KernelEnv overrides where the guest kernel comes from.
const KernelEnv = "COWORK_VMM_KERNEL"

// CmdlineEnv is appended to the guest kernel's command line, for
// diagnosis (e.g. "loglevel=7" shows the boot messages on the console).
const CmdlineEnv = "COWORK_VMM_GUEST_CMDLINE"

// Names of a kernel shipped beside the executable.
var besideExecutable = []string{"vmlinux", "cowork-vmm-vmlinux"}

// kernelImage is a located kernel: a path, or the bytes themselves.
type kernelImage struct {
	path  string
	image []byte
	// from says where it was found, for logs and errors.
	from string
}

// kernelSources are the places a kernel may come from, as functions so
// tests can replace them.
type kernelSources struct {
	override   string // Options.Kernel, else $COWORK_VMM_KERNEL
	embedded   func() (kernelImage, error)
	executable string // the helper's executable ("" if unknown)
	cache      func() (string, error)
}

func defaultKernelSources(override, executable string) kernelSources {
	if override == "" {
		override = os.Getenv(KernelEnv)
	}
	return kernelSources{
		override:   override,
		embedded:   embeddedKernel,
		executable: executable,
		cache:      func() (string, error) { return kernel.Find(kernel.Guest) },
	}
}

// locateKernel finds the guest kernel, in order: the override (option or
// COWORK_VMM_KERNEL, which must exist), the kernel embedded in the binary,
// vmlinux or cowork-vmm-vmlinux beside the executable, the build cache of
// `make kernel`. None → an error saying how to get one.
func locateKernel(src kernelSources) (kernelImage, error) {
	if src.override != "" {
		if err := regularFile(src.override); err != nil {
			return kernelImage{}, fmt.Errorf("the guest kernel named by %s (or --kernel) is unusable: %w", KernelEnv, err)
		}
		return kernelImage{path: src.override, from: "override " + src.override}, nil
	}
	var tried []string
	if src.embedded != nil {
		k, err := src.embedded()
		switch {
		case err == nil:
			return k, nil
		case errors.Is(err, embedded.ErrNotEmbedded):
			tried = append(tried, "not embedded in this binary")
		default:
			return kernelImage{}, fmt.Errorf("the guest kernel embedded in this binary is damaged (rebuild it, or set %s): %w", KernelEnv, err)
		}
	}
	if src.executable != "" {
		dir := filepath.Dir(src.executable)
		for _, name := range besideExecutable {
			p := filepath.Join(dir, name)
			err := regularFile(p)
			if err == nil {
				return kernelImage{path: p, from: "beside the executable: " + p}, nil
			}
			if !errors.Is(err, fs.ErrNotExist) {
				return kernelImage{}, fmt.Errorf("the guest kernel beside the executable is unusable: %w", err)
			}
			tried = append(tried, "no "+p)
		}
	}
	if src.cache != nil {
		p, err := src.cache()
		if err == nil {
			return kernelImage{path: p, from: "the kernel build cache: " + p}, nil
		}
		tried = append(tried, err.Error())
	}
	return kernelImage{}, fmt.Errorf("no guest kernel found (%s): build one with `make kernel` in the cowork-vmm repository "+
		"(then `make build` embeds it in the binary), or set %s to a vmlinux built from guest/kernel/guest.fragment",
		strings.Join(tried, "; "), KernelEnv)
}

// embeddedKernel is the kernel embedded in the executable: unpacked once
// into the user's cache directory and mapped from there on every start
// (inflating ~17 MiB costs every start a fraction of a second, and the
// helper's memory a copy), or, where the cache cannot be written,
// decompressed into memory.
func embeddedKernel() (kernelImage, error) {
	if !embedded.Available() {
		return kernelImage{}, embedded.ErrNotEmbedded
	}
	base, err := os.UserCacheDir()
	if err == nil {
		var p string
		if p, err = embedded.Unpack(filepath.Join(base, "cowork-vmm", "embedded-kernel")); err == nil {
			return kernelImage{path: p, from: "embedded in the executable, unpacked to " + p}, nil
		}
	}
	img, kerr := embedded.Kernel()
	if kerr != nil {
		return kernelImage{}, kerr
	}
	return kernelImage{image: img, from: fmt.Sprintf("embedded in the executable (decompressed in memory: the cache is unusable: %v)", err)}, nil
}

// regularFile checks that p is a readable regular file (symlinks followed).
func regularFile(p string) error {
	info, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", p)
	}
	return nil
}
