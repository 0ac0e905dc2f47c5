package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel/embedded"
	"github.com/cowork-vmm/cowork-vmm/helper"
	hostkvm "github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// kernelNeededMain is `cowork-vmm kernel-needed`, which `make run` asks
// before its first command: exit status 0 when a guest kernel should be
// built first (make kernel), 1 when not, with the reason on stdout. Without
// it, a fresh clone's `make run` on a host whose KVM boots Linux finds no
// kernel and falls back to the process backend.
func kernelNeededMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "usage: cowork-vmm kernel-needed")
		return 2
	}
	exe, _ := os.Executable()
	_, located := kernel.Locate(kernel.DefaultSources("", exe, embeddedPresence))
	need, why := kernelNeeded(os.Getenv("COWORK_VMM_BACKEND"), hostkvm.ProbeHost("").BootsLinux(), located)
	fmt.Fprintln(stdout, "cowork-vmm kernel-needed:", why)
	if need {
		return 0
	}
	return 1
}

// kernelNeeded decides from what `run` would use: backend (the
// COWORK_VMM_BACKEND setting, "" for the default), whether this host's KVM
// boots Linux (hostkvm.HostProbe.BootsLinux) and kernel.Locate's error. A
// kernel is built only where the kvm backend would run and lacks nothing
// else: a kernel named but unusable, or a damaged embedded one, is
// reported by `run` itself, as today.
func kernelNeeded(backend string, bootsLinux, located error) (bool, string) {
	switch {
	case backend != "" && backend != helper.BackendKVM:
		return false, "COWORK_VMM_BACKEND=" + backend + " needs no guest kernel"
	case bootsLinux != nil:
		// The reason is long, and run repeats it: one line here.
		return false, "no guest kernel needed: this host's KVM cannot boot Linux, so run uses the process backend (cowork-vmm doctor says why)"
	case located == nil:
		return false, "the guest kernel is there"
	case errors.Is(located, kernel.ErrNone):
		return true, "this host's KVM boots Linux and no guest kernel is built yet: building one (make kernel, several minutes)"
	}
	return false, fmt.Sprintf("not building a kernel: %v", located)
}

// embeddedPresence is kernel.Sources.Embedded for a question of presence:
// it says whether a kernel is embedded without inflating it.
func embeddedPresence() (kernel.Image, error) {
	if !embedded.Available() {
		return kernel.Image{}, embedded.ErrNotEmbedded
	}
	return kernel.Image{From: "embedded in this binary"}, nil
}
