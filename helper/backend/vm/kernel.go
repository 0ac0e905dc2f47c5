package vm

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel/embedded"
	"github.com/cowork-vmm/cowork-vmm/internal/cachedir"
)

// CmdlineEnv is appended to the guest kernel's command line, for
// diagnosis (e.g. "loglevel=7" shows the boot messages on the console).
const CmdlineEnv = "COWORK_VMM_GUEST_CMDLINE"

// defaultKernelSources are where this backend looks for the guest kernel
// (kernel.Locate's order), with the embedded kernel unpacked to the cache.
func defaultKernelSources(override, executable string) kernel.Sources {
	return kernel.DefaultSources(override, executable, embeddedKernel)
}

// embeddedKernel is the kernel embedded in the executable: unpacked once
// into the user's cache directory and mapped from there on every start
// (inflating ~17 MiB costs every start a fraction of a second, and the
// helper's memory a copy), or, where the cache cannot be written,
// decompressed into memory.
func embeddedKernel() (kernel.Image, error) {
	if !embedded.Available() {
		return kernel.Image{}, embedded.ErrNotEmbedded
	}
	dir, err := cachedir.Dir("", "embedded-kernel")
	if err == nil {
		var p string
		if p, err = embedded.Unpack(dir); err == nil {
			return kernel.Image{Path: p, From: "embedded in the executable, unpacked to " + p}, nil
		}
	}
	img, kerr := embedded.Kernel()
	if kerr != nil {
		return kernel.Image{}, kerr
	}
	return kernel.Image{Bytes: img, From: fmt.Sprintf("embedded in the executable (decompressed in memory: the cache is unusable: %v)", err)}, nil
}
