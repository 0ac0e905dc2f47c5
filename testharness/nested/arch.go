package nested

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/internal/cachedir"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// Architectures of the outer guest (Options.Arch, GoTest.Arch), as GOARCH
// names; "" is ArchAMD64.
const (
	ArchAMD64 = "amd64"
	ArchARM64 = "arm64"
)

// The arm64 outer guest: its qemu, its kernel (guest/kernel's flavour and
// the file qemu boots) and where scripts/arm64-userland.sh caches its
// userland (Debian's busybox-static, curl, ca-certificates and
// qemu-system-arm for arm64 with their dependencies, unpacked as a root).
const (
	qemuBinaryARM64   = "qemu-system-aarch64"
	outerCPUARM64     = "max,pauth-impdef=on"
	outerARM64Flavour = "outer-arm64"
	// outerARM64Pages16K is the same kernel with 16 KiB pages
	// (Options.Pages16K).
	outerARM64Pages16K = "outer-16k-arm64"
	outerARM64Image    = "Image"
	userlandEnv        = "COWORK_VMM_ARM64_USERLAND"
	userlandRoot       = "current/root"
)

// normalArch maps "" to ArchAMD64 and rejects what the harness cannot run.
func normalArch(arch string) (string, error) {
	switch arch {
	case "", ArchAMD64:
		return ArchAMD64, nil
	case ArchARM64:
		return ArchARM64, nil
	}
	return "", fmt.Errorf("nested: architecture %q: want %q or %q", arch, ArchAMD64, ArchARM64)
}

// AvailableArch reports why the harness of arch ("" or "amd64": Available;
// "arm64": qemu-system-aarch64 with the outer-arm64 kernel and the cached
// arm64 userland) cannot run here, or nil.
func AvailableArch(arch string) error {
	arch, err := normalArch(arch)
	if err != nil {
		return err
	}
	if arch == ArchAMD64 {
		return Available()
	}
	if runtime.GOOS != "linux" {
		return fmt.Errorf("nested arm64 harness needs linux, this is %s", runtime.GOOS)
	}
	if _, err := exec.LookPath(qemuBinaryARM64); err != nil {
		return fmt.Errorf("nested arm64 harness needs %s (apt-get install qemu-system-arm): %w", qemuBinaryARM64, err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		return fmt.Errorf("nested arm64 harness cross-builds its outer /init with the go tool, not in PATH: %w", err)
	}
	if _, err := outerARM64Kernel(); err != nil {
		return err
	}
	if _, err := arm64Userland(); err != nil {
		return err
	}
	return nil
}

// outerKernel is the kernel the outer guest of arch boots by default, on
// arm64 the one with 16 KiB pages if pages16K.
func outerKernel(arch string, pages16K bool) (string, error) {
	switch {
	case arch == ArchARM64 && pages16K:
		return outerARM64KernelOf(outerARM64Pages16K)
	case arch == ArchARM64:
		return outerARM64Kernel()
	}
	return kernel.Find(kernel.Outer)
}

// outerARM64Kernel is the outer-arm64 flavour's Image; guest/kernel's
// error says how to build it (make kernel-outer-arm64).
func outerARM64Kernel() (string, error) { return outerARM64KernelOf(outerARM64Flavour) }

// RequireARM64Pages16K skips t unless the arm64 harness can run with 16
// KiB pages in its outer guest (Options.Pages16K): the harness, and the
// outer kernel built with them (make kernel-outer-16k-arm64).
func RequireARM64Pages16K(t testing.TB) {
	t.Helper()
	RequireARM64Harness(t)
	if _, err := outerARM64KernelOf(outerARM64Pages16K); err != nil {
		t.Skipf("no arm64 outer kernel with 16 KiB pages: %v", err)
	}
}

// outerARM64KernelOf is an arm64 outer flavour's Image.
func outerARM64KernelOf(flavour string) (string, error) {
	p, err := kernel.FindImage(flavour, outerARM64Image)
	if err != nil {
		return "", fmt.Errorf("nested arm64 harness: %w", err)
	}
	return p, nil
}

// userlandNeeds are the files the arm64 userland must hold (through its
// merged-/usr links): busybox, whose applets outerinit links, and what the
// arm64 tests run. A root from before curl and qemu joined lacks them.
var userlandNeeds = []string{"bin/busybox", "usr/bin/curl", "usr/bin/qemu-system-aarch64", "lib/ld-linux-aarch64.so.1"}

// arm64Userland is the cached arm64 root (its real path, for qemu's
// -fsdev), which the arm64 outer guest's root is made of.
func arm64Userland() (string, error) {
	dir, err := cachedir.Dir(userlandEnv, "arm64-userland")
	if err != nil {
		return "", fmt.Errorf("nested arm64 harness: userland: %w", err)
	}
	root := filepath.Join(dir, userlandRoot)
	for _, need := range userlandNeeds {
		p := filepath.Join(root, need)
		info, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return "", fmt.Errorf("nested arm64 harness: no arm64 userland cached (looked for %s): run scripts/arm64-userland.sh (as root: it adds dpkg's arm64 architecture and downloads busybox-static, curl and qemu-system-arm for arm64)", p)
		case err != nil:
			return "", fmt.Errorf("nested arm64 harness: userland: %w", err)
		case !info.Mode().IsRegular():
			return "", fmt.Errorf("nested arm64 harness: userland %s is not a regular file", p)
		}
	}
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", fmt.Errorf("nested arm64 harness: userland: %w", err)
	}
	return real, nil
}

// qemuBinaryFor is the emulator of arch's outer guest.
func qemuBinaryFor(arch string) string {
	if arch == ArchARM64 {
		return qemuBinaryARM64
	}
	return qemuBinary
}

// outerCmdlineARM64: the console on the virt machine's PL011; panic=-1 so a
// panic restarts, which ends qemu under -no-reboot (as outerinit's own
// restart does: PSCI SYSTEM_RESET); quiet because every console byte is
// slow under emulation. The arm64 kernel keeps time with the architected
// counter (arch_sys_counter), which needs no rate on the command line.
const outerCmdlineARM64 = "console=ttyAMA0 panic=-1 quiet"

// qemuArgsARM64 is the arm64 outer guest's command line (NESTED-TEST.md's
// "An arm64 harness"): the virt machine with EL2 (virtualization=on), so
// the outer kernel runs KVM in VHE mode and has a real /dev/kvm, and a
// GICv3, which KVM's in-kernel GIC emulation needs. The virtio-9p devices
// sit on virt's virtio-mmio transports, which the device tree announces.
// The host's root is not shared: it is x86 and useless to arm64 programs;
// the arm64 userland is (opts.userland, read-only), and outerinit lays a
// tmpfs over it.
// pauth-impdef=on: pointer authentication with qemu's own cheap algorithm
// instead of the architected QARMA, which TCG computes slowly on every
// signed return of the kernel and of Go programs: with Debian's arm64
// kernel the outer /init came after 3.7-4.2 s of guest uptime instead of
// 14-16 s, and a shell run took 7.5 s instead of 19-23 s. (Our outer-arm64
// kernel is built without pointer authentication and boots in about 1 s
// either way; the gain is for kernels and inner guests that use it.)
func qemuArgsARM64(opts Options, payload, initrd string) []string {
	devices := ninePDevice("payload", payload, job.PayloadTag, false)
	if opts.userland != "" {
		devices = append(devices, ninePDevice("userland", opts.userland, job.UserlandTag, true)...)
	}
	machine := "virt,virtualization=on,gic-version=3"
	if opts.GICv2 {
		machine = "virt,virtualization=on,gic-version=2"
	}
	return outerQemuArgs(opts, machine, outerCPUARM64, outerCmdlineARM64, initrd, devices...)
}

// shareArgs are the qemu arguments of Options.Shares: read-only virtio-9p
// devices tagged job.ShareTag(i).
func shareArgs(shares []string) []string {
	var args []string
	for i, dir := range shares {
		tag := job.ShareTag(i)
		args = append(args, ninePDevice(tag, dir, tag, true)...)
	}
	return args
}
