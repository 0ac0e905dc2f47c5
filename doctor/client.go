package doctor

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ClientHelperPath is where the official .deb of Claude Desktop keeps the
// helper it starts (CLIENT-FACTS.md); no setting points it elsewhere.
const ClientHelperPath = "/usr/lib/claude-desktop/resources/cowork-linux-helper"

// BackupSuffix names the official helper kept by
// scripts/install-client-helper.sh when it puts cowork-vmm in its place.
const BackupSuffix = ".cowork-vmm-backup"

// ModulePath is cowork-vmm's Go module, as debug/buildinfo reports it.
const ModulePath = "github.com/cowork-vmm/cowork-vmm"

const vhostVsockPath = "/dev/vhost-vsock"

// gateFirmware is the client's firmware search on goarch: the first
// readable CODE file, with its VARS file beside it.
type firmwarePair struct{ code, vars string }

func gateFirmware(goarch string) []firmwarePair {
	if goarch == "arm64" {
		return []firmwarePair{{"/usr/share/AAVMF/AAVMF_CODE.fd", "/usr/share/AAVMF/AAVMF_VARS.fd"}}
	}
	return []firmwarePair{
		{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"},
		{"/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd"},
	}
}

var gateVirtiofsd = []string{"/usr/libexec/virtiofsd", "/usr/bin/virtiofsd"}

// Where distributions put virtiofsd that the gate does not look at.
var otherVirtiofsd = []string{"/usr/lib/qemu/virtiofsd", "/usr/lib/virtiofsd"}

// qemuBinary is the qemu the client's gate looks for on goarch.
func qemuBinary(goarch string) string {
	if goarch == "arm64" {
		return "qemu-system-aarch64"
	}
	return "qemu-system-x86_64"
}

// How to install the gate's qemu and firmware, per architecture. On arm64
// Debian's qemu-system-arm holds qemu-system-aarch64, and qemu-efi-aarch64
// the AAVMF pair.
func qemuInstallFix(goarch string) string {
	if goarch == "arm64" {
		return "install it so the gate passes: sudo apt install qemu-system-arm qemu-efi-aarch64 (Debian/Ubuntu; the firmware the gate also checks comes with the second), " +
			"sudo dnf install qemu-system-aarch64-core edk2-aarch64 (Fedora), sudo pacman -S qemu-system-aarch64 edk2-aarch64 (Arch)"
	}
	return "install it so the gate passes: sudo apt install qemu-system-x86 (Debian/Ubuntu), sudo dnf install qemu-system-x86-core (Fedora), sudo pacman -S qemu-base (Arch)"
}

func firmwareInstallFix(goarch string) string {
	if goarch == "arm64" {
		return "sudo apt install qemu-efi-aarch64 (Debian/Ubuntu); elsewhere install your distribution's AArch64 UEFI firmware " +
			"(Fedora and Arch: edk2-aarch64) and, if it puts its CODE and VARS files elsewhere, link them to those paths"
	}
	return "sudo apt install ovmf (Debian/Ubuntu); elsewhere link your distribution's files to those paths, e.g. Fedora: sudo mkdir -p /usr/share/OVMF && sudo ln -s /usr/share/edk2/ovmf/OVMF_CODE.fd /usr/share/edk2/ovmf/OVMF_VARS.fd /usr/share/OVMF/"
}

// Menu launches of the client may have a minimal PATH.
var minimalPath = []string{"/usr/bin", "/bin", "/usr/local/bin"}

const gateNote = "cowork-vmm does not use it"

// clientChecks reports Claude Desktop's view: which helper it will start and
// what its support gate checks. It returns whether the gate passes and what
// the gate will conclude.
func (r *runner) clientChecks() (passes bool, conclusion string) {
	r.clientHelperCheck()
	var failures []string
	for _, check := range []func() (Check, string){r.gateQEMUCheck, r.gateFirmwareCheck, r.gateVirtiofsdCheck, r.gateKVMCheck, r.gateVhostVsockCheck} {
		c, failure := check()
		if failure != "" {
			failures = append(failures, failure)
		}
		r.add(c)
	}
	if len(failures) == 0 {
		return true, "the gate will pass (unless a server-side flag disables Cowork), and the client starts the helper at " + r.clientHelperPath()
	}
	return false, "the gate will mark Cowork unsupported (" + strings.Join(failures, "; ") + ") and start no helper, ours or the official one; fix the gate checks above, or use a client patched to skip the gate"
}

// gateQEMUCheck: qemu on PATH.
func (r *runner) gateQEMUCheck() (c Check, failure string) {
	fail := func(reason string) { c.Status, failure = StatusFail, reason }
	c = Check{ID: CheckGateQEMU, Group: GroupClient, Title: "Gate: qemu"}
	name := qemuBinary(r.h.Arch)
	if p, err := r.h.LookPath(name); err == nil {
		c.Status = StatusOK
		c.Detail = p + " (" + gateNote + ")"
		if !inMinimalPath(p) {
			c.Status = StatusWarn
			c.Detail = p + " is on your PATH but not in /usr/bin, /bin or /usr/local/bin: a client started from the desktop menu may not find it"
			c.Fix = fmt.Sprintf("sudo ln -s %s /usr/local/bin/%s", p, name)
		}
	} else {
		fail("virtualization_tools_missing (" + name + ")")
		c.Detail = name + " is not on PATH: the gate reports virtualization_tools_missing (" + gateNote + ")"
		c.Fix = qemuInstallFix(r.h.Arch)
	}
	return c, failure
}

// gateFirmwareCheck: the UEFI firmware pair.
func (r *runner) gateFirmwareCheck() (c Check, failure string) {
	fail := func(reason string) { c.Status, failure = StatusFail, reason }
	c = Check{ID: CheckGateFirmware, Group: GroupClient, Title: "Gate: UEFI firmware"}
	pairs := gateFirmware(r.h.Arch)
	for _, p := range pairs {
		if r.h.Access(p.code, unix.R_OK) == nil && r.h.Access(p.vars, unix.R_OK) == nil {
			c.Status = StatusOK
			c.Detail = p.code + " and " + p.vars + " (" + gateNote + ")"
			break
		}
	}
	if c.Status == "" {
		fail("virtualization_tools_missing (firmware)")
		c.Detail = "none of " + pairsString(pairs) + " is readable with its VARS file: the gate reports the tools missing (" + gateNote + ")"
		c.Fix = firmwareInstallFix(r.h.Arch)
	}
	return c, failure
}

// gateVirtiofsdCheck: virtiofsd where the gate looks.
func (r *runner) gateVirtiofsdCheck() (c Check, failure string) {
	fail := func(reason string) { c.Status, failure = StatusFail, reason }
	c = Check{ID: CheckGateVirtiofsd, Group: GroupClient, Title: "Gate: virtiofsd"}
	for _, p := range gateVirtiofsd {
		if r.h.Access(p, unix.R_OK) == nil {
			c.Status = StatusOK
			c.Detail = p + " (" + gateNote + ")"
			break
		}
	}
	if c.Status == "" {
		fail("virtualization_tools_missing (virtiofsd)")
		c.Detail = "no readable " + strings.Join(gateVirtiofsd, " or ") + ": the gate reports the tools missing (" + gateNote + ")"
		c.Fix = "sudo apt install virtiofsd (Ubuntu 24.04+, Debian 13+; Debian 12: from bookworm-backports), sudo dnf install virtiofsd (Fedora)"
		for _, p := range otherVirtiofsd {
			if r.h.Access(p, unix.R_OK) == nil {
				c.Detail += "; there is one at " + p + ", where the gate does not look"
				c.Fix = fmt.Sprintf("sudo ln -s %s /usr/libexec/virtiofsd; or %s", p, c.Fix)
				break
			}
		}
	}
	return c, failure
}

// gateKVMCheck: /dev/kvm read+write by access(2).
func (r *runner) gateKVMCheck() (c Check, failure string) {
	fail := func(reason string) { c.Status, failure = StatusFail, reason }
	c = Check{ID: CheckGateKVM, Group: GroupClient, Title: "Gate: /dev/kvm"}
	switch err := r.h.Access("/dev/kvm", unix.R_OK|unix.W_OK); {
	case err == nil:
		c.Status = StatusOK
		c.Detail = "/dev/kvm is readable and writable"
	case errors.Is(err, fs.ErrNotExist):
		fail("no /dev/kvm")
		c.Detail = "/dev/kvm does not exist: the gate marks Cowork unsupported, and the client starts no helper at all — not even for COWORK_VMM_BACKEND=process"
		c.Fix = "make /dev/kvm exist (see the KVM device check above); without it only a patched client (the community app.asar gate patch) will start cowork-vmm"
	default:
		fail("kvm_permission_denied")
		c.Detail = "/dev/kvm is not readable and writable by you: the gate reports kvm_permission_denied"
		c.Fix = kvmGroupFix
	}
	return c, failure
}

// gateVhostVsockCheck: /dev/vhost-vsock read+write by access(2).
func (r *runner) gateVhostVsockCheck() (c Check, failure string) {
	fail := func(reason string) { c.Status, failure = StatusFail, reason }
	c = Check{ID: CheckGateVhostVsock, Group: GroupClient, Title: "Gate: /dev/vhost-vsock"}
	switch err := r.h.Access(vhostVsockPath, unix.R_OK|unix.W_OK); {
	case err == nil:
		c.Status = StatusOK
		c.Detail = vhostVsockPath + " is readable and writable (cowork-vmm does not use it; the gate checks it)"
	case errors.Is(err, fs.ErrNotExist):
		if _, merr := r.h.Stat("/sys/module/vhost_vsock"); merr == nil {
			fail("vhost_vsock_kernel_unsupported")
			c.Detail = "the vhost_vsock module is loaded but " + vhostVsockPath + " does not exist: the gate reports vhost_vsock_kernel_unsupported"
			c.Fix = "sudo udevadm trigger (or reboot) so the device node appears; cowork-vmm itself does not need it"
		} else {
			fail("vhost_vsock_module_missing")
			c.Detail = vhostVsockPath + " does not exist (vhost_vsock not loaded): the gate reports vhost_vsock_module_missing (cowork-vmm does not use it)"
			c.Fix = "sudo modprobe vhost_vsock (at boot: echo vhost_vsock | sudo tee /etc/modules-load.d/vhost_vsock.conf); on kernels without it (e.g. Crostini) only a patched client starts cowork-vmm"
		}
	default:
		fail("no access to " + vhostVsockPath)
		c.Detail = vhostVsockPath + " exists but is not readable and writable by you: the gate refuses it (cowork-vmm does not use it)"
		c.Fix = `echo 'KERNEL=="vhost-vsock", GROUP="kvm", MODE="0660"' | sudo tee /etc/udev/rules.d/65-vhost-vsock.rules && sudo udevadm control --reload && sudo udevadm trigger (and be in the kvm group)`
	}
	return c, failure
}

func (r *runner) clientHelperPath() string {
	if r.opts.ClientHelperPath != "" {
		return r.opts.ClientHelperPath
	}
	return ClientHelperPath
}

// clientHelperCheck says which helper Claude Desktop will start.
func (r *runner) clientHelperCheck() {
	c := Check{ID: CheckClientHelper, Group: GroupClient, Title: "Client's helper"}
	defer func() { r.add(c) }()
	path := r.clientHelperPath()
	install := "scripts/install-client-helper.sh install"
	info, err := r.h.Lstat(path)
	switch {
	case err != nil && errors.Is(err, fs.ErrNotExist):
		c.Status = StatusWarn
		c.Detail = "no helper at " + path + ": Claude Desktop (.deb) is not installed, or this packaging puts it elsewhere"
		c.Fix = "install Claude Desktop, or pass --client-helper PATH to name where your packaging keeps cowork-linux-helper"
		return
	case err != nil:
		c.Status = StatusWarn
		c.Detail = fmt.Sprintf("cannot look at %s: %v", path, err)
		return
	}
	symlink := info.Mode()&fs.ModeSymlink != 0
	same, sameErr := r.sameAsExecutable(path)
	mod, ver, biErr := r.h.BuildInfo(path)
	_, backupErr := r.h.Lstat(path + BackupSuffix)
	backup := ""
	if backupErr == nil {
		backup = "; the official helper is kept at " + path + BackupSuffix
	}
	switch {
	case sameErr == nil && same:
		c.Status = StatusOK
		c.Detail = path + " is this cowork-vmm binary: Claude Desktop will start it" + backup
	case biErr == nil && mod == ModulePath:
		c.Status = StatusWarn
		c.Detail = fmt.Sprintf("%s is a cowork-vmm build (%s) but not this binary%s", path, ver, backup)
		c.Fix = "to make the client start this build: " + install
	default:
		c.Status = StatusWarn
		c.Detail = path + " is the official helper (not cowork-vmm): Claude Desktop will start it, not cowork-vmm"
		if symlink {
			c.Detail = path + " is a symlink to a binary that is not cowork-vmm: Claude Desktop will start that"
		}
		c.Fix = "to make the client start cowork-vmm (the original is kept as a backup): sudo " + install + "; re-run it after every client update"
	}
}

// sameAsExecutable compares path's content with this executable's by
// SHA-256.
func (r *runner) sameAsExecutable(path string) (bool, error) {
	exe, err := r.h.Executable()
	if err != nil {
		return false, err
	}
	a, err := r.hashFile(path)
	if err != nil {
		return false, err
	}
	b, err := r.hashFile(exe)
	if err != nil {
		return false, err
	}
	return bytes.Equal(a, b), nil
}

func (r *runner) hashFile(path string) ([]byte, error) {
	f, err := r.h.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, 1<<30)); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

func inMinimalPath(p string) bool {
	dir := filepath.Dir(p)
	for _, d := range minimalPath {
		if dir == d {
			return true
		}
	}
	return false
}

func pairsString(pairs []firmwarePair) string {
	var s []string
	for _, p := range pairs {
		s = append(s, p.code)
	}
	return strings.Join(s, ", ")
}
