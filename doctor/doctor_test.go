package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

func TestHealthyHostPasses(t *testing.T) {
	h := healthyHost()
	r := h.run(t, Options{})
	for _, c := range r.Checks {
		if c.Status == StatusFail || c.Status == StatusWarn {
			t.Errorf("%s: %s: %s (fix: %s)", c.ID, c.Status, c.Detail, c.Fix)
		}
	}
	wantUsable(t, r, BackendKVM, BackendProcess)
	if r.ExitCode() != 0 || !r.Verdict.DefaultBackendWorks || !r.Verdict.HelperCanServe || !r.Verdict.ClientGatePasses {
		t.Errorf("verdict %+v, exit %d; want everything working, exit 0", r.Verdict, r.ExitCode())
	}
	k := wantStatus(t, r, CheckKernel, StatusOK)
	wantContains(t, "kernel detail", k.Detail, "6.1.99-cowork", "/home/u/.cache/k/vmlinux", "VM bundle image (its rootfs.img", "else over the host's system directories")
	caps := wantStatus(t, r, CheckKVMCaps, StatusOK)
	wantContains(t, "capabilities detail", caps.Detail, "KVM_CAP_IRQCHIP", "KVM_CAP_IMMEDIATE_EXIT")
	if len(h.boots) != 0 {
		t.Errorf("trial boots %v without --boot", h.boots)
	}
	wantStatus(t, r, CheckBootKVM, StatusSkip)
}

func TestNoKVMDevice(t *testing.T) {
	h := healthyHost()
	delete(h.files, "/dev/kvm")
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckKVMDevice, StatusFail)
	wantContains(t, "fix", c.Fix, "sudo modprobe kvm_intel")
	wantContains(t, "detail", c.Detail, "CPU has vmx")
	for _, id := range []string{CheckKVMAccess, CheckKVMAPI, CheckKVMCaps} {
		wantStatus(t, r, id, StatusSkip)
	}
	wantUsable(t, r, BackendProcess)
	if r.ExitCode() != 1 {
		t.Errorf("exit %d, want 1", r.ExitCode())
	}
	wantContains(t, "summary", r.Verdict.Summary, "COWORK_VMM_BACKEND=process")
	// The client's gate refuses too, and says it starts no helper.
	g := wantStatus(t, r, CheckGateKVM, StatusFail)
	wantContains(t, "gate detail", g.Detail, "starts no helper")
	if r.Verdict.ClientGatePasses {
		t.Error("gate said to pass without /dev/kvm")
	}
}

func TestNoKVMDeviceAMDAndNoVirtualization(t *testing.T) {
	h := healthyHost()
	delete(h.files, "/dev/kvm")
	h.files["/proc/cpuinfo"] = fakeFile{data: []byte("flags\t: fpu svm\n")}
	c := wantStatus(t, h.run(t, Options{}), CheckKVMDevice, StatusFail)
	wantContains(t, "fix", c.Fix, "sudo modprobe kvm_amd")

	h.files["/proc/cpuinfo"] = fakeFile{data: []byte("flags\t: fpu sse2\n")}
	c = wantStatus(t, h.run(t, Options{}), CheckKVMDevice, StatusFail)
	wantContains(t, "fix", c.Fix, "BIOS/UEFI", "nested virtualization", "COWORK_VMM_BACKEND=process")
}

func TestKVMRegisteredButNoNode(t *testing.T) {
	h := healthyHost()
	delete(h.files, "/dev/kvm")
	h.files["/sys/class/misc/kvm"] = fakeFile{mode: fs.ModeDir | 0o755}
	h.files["/sys/class/misc/kvm/dev"] = fakeFile{data: []byte("10:232\n")}
	c := wantStatus(t, h.run(t, Options{}), CheckKVMDevice, StatusFail)
	wantContains(t, "fix", c.Fix, "mknod -m 0660 /dev/kvm c 10 232")
}

func TestKVMPermissionDenied(t *testing.T) {
	h := healthyHost()
	h.kvm = kvm.HostProbe{OpenErr: fmt.Errorf("%w: cannot open /dev/kvm (permission denied)", kvm.ErrKVMPermission)}
	dev := h.files["/dev/kvm"]
	dev.noAccess = true
	h.files["/dev/kvm"] = dev
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckKVMAccess, StatusFail)
	wantContains(t, "fix", c.Fix, "sudo usermod -aG kvm $USER", `KERNEL=="kvm", GROUP="kvm", MODE="0660"`, "log out")
	wantStatus(t, r, CheckKVMAPI, StatusSkip)
	if r.ExitCode() != 1 {
		t.Errorf("exit %d, want 1", r.ExitCode())
	}
	g := wantStatus(t, r, CheckGateKVM, StatusFail)
	wantContains(t, "gate detail", g.Detail, "kvm_permission_denied")
}

func TestKVMGroupNeedsNewLogin(t *testing.T) {
	h := healthyHost()
	h.kvm = kvm.HostProbe{OpenErr: fmt.Errorf("%w: denied", kvm.ErrKVMPermission)}
	h.files["/dev/kvm"] = fakeFile{mode: fs.ModeDevice | fs.ModeCharDevice | 0o660, gid: 108}
	h.files["/etc/passwd"] = fakeFile{data: []byte("root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/sh\n")}
	h.files["/etc/group"] = fakeFile{data: []byte("root:x:0:\nkvm:x:108:alice,u\n")}
	c := wantStatus(t, h.run(t, Options{}), CheckKVMAccess, StatusFail)
	wantContains(t, "detail", c.Detail, "member of its group kvm", "before you were added")
	wantContains(t, "fix", c.Fix, "log out and back in", "newgrp kvm")

	// Already in the group in this session: the plain group/udev fix.
	h.groups = []int{108}
	c = wantStatus(t, h.run(t, Options{}), CheckKVMAccess, StatusFail)
	wantContains(t, "fix", c.Fix, "sudo usermod -aG kvm $USER")
}

func TestPVMCannotBootLinux(t *testing.T) {
	h := healthyHost()
	h.pvm, h.pvmWhy = true, "the kvm_pvm module is loaded"
	h.files["/proc/cpuinfo"] = fakeFile{data: []byte("flags\t: fpu sse2\n")}
	r := h.run(t, Options{Boot: true})
	c := wantStatus(t, r, CheckKVMLinux, StatusFail)
	wantContains(t, "detail", c.Detail, "cannot boot a Linux guest", "PVM", "kvm_pvm")
	wantContains(t, "fix", c.Fix, "COWORK_VMM_BACKEND=process")
	wantStatus(t, r, CheckBootKVM, StatusSkip)
	wantStatus(t, r, CheckBootProcess, StatusOK)
	if strings.Join(h.boots, ",") != BackendProcess {
		t.Errorf("trial boots %v, want only the process backend", h.boots)
	}
	wantUsable(t, r, BackendProcess)
	if r.ExitCode() != 1 {
		t.Errorf("exit %d with the kvm backend selected on PVM, want 1", r.ExitCode())
	}
	// Choosing the process backend makes the helper's backend work.
	h.env["COWORK_VMM_BACKEND"] = BackendProcess
	r = h.run(t, Options{})
	if r.ExitCode() != 0 || r.Verdict.DefaultBackend != BackendProcess || !r.Verdict.DefaultBackendWorks {
		t.Errorf("with COWORK_VMM_BACKEND=process: verdict %+v, exit %d; want process working, exit 0", r.Verdict, r.ExitCode())
	}
}

// The machine these tests were written on: kvm_pvm loaded, no /dev/kvm, no
// vmx/svm.
func TestPVMModuleWithoutDevice(t *testing.T) {
	h := healthyHost()
	delete(h.files, "/dev/kvm")
	h.files["/sys/module/kvm_pvm"] = fakeFile{mode: fs.ModeDir | 0o755}
	h.files["/proc/cpuinfo"] = fakeFile{data: []byte("flags\t: fpu sse2\n")}
	h.pvm, h.pvmWhy = true, "the kvm_pvm module is loaded"
	r := h.run(t, Options{})
	dev := wantStatus(t, r, CheckKVMDevice, StatusFail)
	wantContains(t, "detail", dev.Detail, "kvm_pvm", "registered no KVM device", "no vmx/svm")
	wantContains(t, "fix", dev.Fix, "enable nested virtualization", "COWORK_VMM_BACKEND=process")
	linux := wantStatus(t, r, CheckKVMLinux, StatusFail)
	wantContains(t, "detail", linux.Detail, "cannot boot a Linux guest", "does not even provide /dev/kvm")
	wantContains(t, "summary", r.Verdict.Summary, "PVM", "COWORK_VMM_BACKEND=process")
}

func TestKVMAPIAndCapabilities(t *testing.T) {
	h := healthyHost()
	h.kvm = kvm.HostProbe{APIVersion: 11}
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckKVMAPI, StatusFail)
	wantContains(t, "detail", c.Detail, "version 11", "needs 12")
	wantStatus(t, r, CheckKVMCaps, StatusSkip)

	caps := map[string]bool{}
	for _, c := range kvm.RequiredCapabilitiesFor("amd64") {
		caps[c.String()] = true
	}
	caps["KVM_CAP_IRQFD"] = false
	caps["KVM_CAP_PIT2"] = false
	h.kvm = kvm.HostProbe{APIVersion: 12, Capabilities: caps}
	r = h.run(t, Options{})
	c = wantStatus(t, r, CheckKVMCaps, StatusFail)
	wantContains(t, "detail", c.Detail, "KVM_CAP_IRQFD", "KVM_CAP_PIT2")
	if strings.Contains(c.Detail, "KVM_CAP_IRQCHIP") {
		t.Errorf("detail %q names a capability that is present", c.Detail)
	}
	wantUsable(t, r, BackendProcess)

	h.kvm = kvm.HostProbe{APIVersion: 12, CapabilitiesErr: errors.New("this kernel's KVM lacks KVM_CAP_IMMEDIATE_EXIT")}
	c = wantStatus(t, h.run(t, Options{}), CheckKVMCaps, StatusFail)
	wantContains(t, "detail", c.Detail, "KVM_CAP_IMMEDIATE_EXIT")
}

func TestWorldWritableRuntimeDir(t *testing.T) {
	h := healthyHost()
	h.files["/run/user/1000"] = fakeFile{mode: fs.ModeDir | 0o777, uid: testUID}
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckRuntimeDir, StatusFail)
	wantContains(t, "detail", c.Detail, "0777", "writable")
	if c.Fix != "chmod 0700 /run/user/1000" {
		t.Errorf("fix %q, want chmod 0700 /run/user/1000", c.Fix)
	}
	wantStatus(t, r, CheckSocketPath, StatusOK) // still looked at
	if r.Verdict.HelperCanServe || r.ExitCode() != 1 {
		t.Errorf("verdict %+v, exit %d: the helper cannot serve from a world-writable directory", r.Verdict, r.ExitCode())
	}
	wantUsable(t, r, BackendKVM, BackendProcess) // the backends themselves work

	// Readable by others is refused too (protocol.Listen wants 0700).
	h.files["/run/user/1000"] = fakeFile{mode: fs.ModeDir | 0o755, uid: testUID}
	c = wantStatus(t, h.run(t, Options{}), CheckRuntimeDir, StatusFail)
	wantContains(t, "fix", c.Fix, "chmod 0700")

	h.files["/run/user/1000"] = fakeFile{mode: fs.ModeDir | 0o700, uid: 0}
	c = wantStatus(t, h.run(t, Options{}), CheckRuntimeDir, StatusFail)
	wantContains(t, "fix", c.Fix, "sudo chown 1000 /run/user/1000")
}

func TestRuntimeDirUnsetOrMissing(t *testing.T) {
	h := healthyHost()
	delete(h.env, "XDG_RUNTIME_DIR")
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckRuntimeDir, StatusWarn)
	wantContains(t, "detail", c.Detail, "/tmp/claude-cowork-1000")
	if r.ExitCode() != 0 {
		t.Errorf("exit %d, want 0: the fallback directory works", r.ExitCode())
	}

	h.env["XDG_RUNTIME_DIR"] = "/run/user/1000/gone"
	r = h.run(t, Options{})
	wantStatus(t, r, CheckRuntimeDir, StatusFail)
	wantStatus(t, r, CheckSocketPath, StatusSkip)
}

func TestSocketPathSymlinkOrFile(t *testing.T) {
	h := healthyHost()
	sock := "/run/user/1000/" + SocketName
	h.files[sock] = fakeFile{mode: fs.ModeSymlink | 0o777, uid: testUID}
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckSocketPath, StatusFail)
	wantContains(t, "detail", c.Detail, "symlink")
	wantContains(t, "fix", c.Fix, "rm "+sock)
	if r.ExitCode() != 1 {
		t.Errorf("exit %d, want 1", r.ExitCode())
	}

	h.files[sock] = fakeFile{mode: 0o644, uid: testUID}
	c = wantStatus(t, h.run(t, Options{}), CheckSocketPath, StatusFail)
	wantContains(t, "detail", c.Detail, "not a socket")

	h.files[sock] = fakeFile{mode: fs.ModeSocket | 0o600, uid: testUID}
	wantStatus(t, h.run(t, Options{}), CheckSocketPath, StatusOK)
}

func TestNoKernel(t *testing.T) {
	h := healthyHost()
	h.cache = ""
	r := h.run(t, Options{Boot: true})
	c := wantStatus(t, r, CheckKernel, StatusFail)
	wantContains(t, "fix", c.Fix, "make kernel", "COWORK_VMM_KERNEL")
	wantContains(t, "detail", c.Detail, "not embedded", "no /usr/local/bin/vmlinux")
	wantStatus(t, r, CheckBootKVM, StatusSkip)
	wantUsable(t, r, BackendProcess)
	if r.ExitCode() != 1 {
		t.Errorf("exit %d, want 1", r.ExitCode())
	}
}

func TestKernelSources(t *testing.T) {
	h := healthyHost()
	h.env["COWORK_VMM_KERNEL"] = "/nope/vmlinux"
	c := wantStatus(t, h.run(t, Options{}), CheckKernel, StatusFail)
	wantContains(t, "detail", c.Detail, "COWORK_VMM_KERNEL", "/nope/vmlinux")

	h.files["/k/bzImage"] = fakeFile{mode: 0o644, data: fakeBzImage("6.1.7-custom (me@box) #2")}
	h.env["COWORK_VMM_KERNEL"] = "/k/bzImage"
	c = wantStatus(t, h.run(t, Options{}), CheckKernel, StatusOK)
	wantContains(t, "detail", c.Detail, "Linux 6.1.7-custom", "COWORK_VMM_KERNEL")

	delete(h.env, "COWORK_VMM_KERNEL")
	h.embedded = []byte("\x7fELF....Linux version 6.1.55-embedded (x) #1\x00")
	c = wantStatus(t, h.run(t, Options{}), CheckKernel, StatusOK)
	wantContains(t, "detail", c.Detail, "6.1.55-embedded", "embedded")

	h.embedded = nil
	h.files["/usr/local/bin/vmlinux"] = fakeFile{mode: 0o644, data: []byte("no banner here")}
	c = wantStatus(t, h.run(t, Options{}), CheckKernel, StatusWarn)
	wantContains(t, "detail", c.Detail, "beside the executable", "no Linux version string")
}

func TestNoUserNamespaces(t *testing.T) {
	h := healthyHost()
	h.usernsErr = errors.New("fork/exec /bin/true: operation not permitted")
	h.files["/proc/sys/kernel/unprivileged_userns_clone"] = fakeFile{data: []byte("0\n")}
	r := h.run(t, Options{Boot: true})
	c := wantStatus(t, r, CheckUserNS, StatusFail)
	wantContains(t, "detail", c.Detail, "operation not permitted", "kernel.unprivileged_userns_clone=0")
	wantContains(t, "fix", c.Fix, "sudo sysctl -w kernel.unprivileged_userns_clone=1")
	wantStatus(t, r, CheckBootProcess, StatusSkip)
	wantUsable(t, r, BackendKVM)
	if r.ExitCode() != 0 {
		t.Errorf("exit %d, want 0: the default kvm backend works", r.ExitCode())
	}

	delete(h.files, "/proc/sys/kernel/unprivileged_userns_clone")
	h.files["/proc/sys/user/max_user_namespaces"] = fakeFile{data: []byte("0\n")}
	c = wantStatus(t, h.run(t, Options{}), CheckUserNS, StatusFail)
	wantContains(t, "fix", c.Fix, "user.max_user_namespaces=15000")
}

func TestUserNamespacesInAChroot(t *testing.T) {
	h := healthyHost()
	h.usernsErr = errors.New("fork/exec /bin/true: operation not permitted")
	h.files["/"] = fakeFile{mode: fs.ModeDir | 0o755, ino: 2}
	h.files["/proc/1/root"] = fakeFile{mode: fs.ModeDir | 0o755, ino: 7}
	c := wantStatus(t, h.run(t, Options{}), CheckUserNS, StatusFail)
	wantContains(t, "detail", c.Detail, "chroot")
	wantContains(t, "fix", c.Fix, "outside the chroot")

	h.files["/proc/1/root"] = h.files["/"]
	c = wantStatus(t, h.run(t, Options{}), CheckUserNS, StatusFail)
	if strings.Contains(c.Detail, "chroot") {
		t.Errorf("same root as PID 1, yet the detail blames a chroot: %s", c.Detail)
	}
	wantContains(t, "fix", c.Fix, "CONFIG_USER_NS")
}

func TestAppArmorRestrictsUserNamespaces(t *testing.T) {
	h := healthyHost()
	h.files["/proc/sys/kernel/apparmor_restrict_unprivileged_userns"] = fakeFile{data: []byte("1\n")}
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckUserNS, StatusWarn)
	wantContains(t, "fix", c.Fix, "/etc/apparmor.d/cowork-vmm", "userns,", "/usr/local/bin/cowork-vmm")
	wantUsable(t, r, BackendKVM, BackendProcess)
}

func TestDiskSpace(t *testing.T) {
	h := healthyHost()
	h.free = 1 << 30
	c := wantStatus(t, h.run(t, Options{}), CheckDisk, StatusWarn)
	wantContains(t, "detail", c.Detail, "1.0 GiB", "/home/u/.local/share/cowork-vmm")
	h.free = 10 << 20
	r := h.run(t, Options{})
	wantStatus(t, r, CheckDisk, StatusFail)
	if r.ExitCode() != 1 {
		t.Errorf("exit %d with 10 MiB free, want 1", r.ExitCode())
	}
}

func TestTrialBoot(t *testing.T) {
	h := healthyHost()
	h.boot[BackendKVM] = errors.New("KVM internal error, emulation failure")
	r := h.run(t, Options{Boot: true})
	c := wantStatus(t, r, CheckBootKVM, StatusFail)
	wantContains(t, "detail", c.Detail, "emulation failure")
	wantContains(t, "fix", c.Fix, "COWORK_VMM_BACKEND=process")
	p := wantStatus(t, r, CheckBootProcess, StatusOK)
	wantContains(t, "detail", p.Detail, "1.25 s", "6.1.99-cowork")
	wantUsable(t, r, BackendProcess)
	if r.ExitCode() != 1 {
		t.Errorf("exit %d with a failing kvm boot, want 1", r.ExitCode())
	}
	if strings.Join(h.boots, ",") != "kvm,process" {
		t.Errorf("trial boots %v, want kvm,process", h.boots)
	}
	if h.bootBudget <= 0 || h.bootBudget > DefaultBootTimeout {
		t.Errorf("trial boot given %v, want at most the default %v", h.bootBudget, DefaultBootTimeout)
	}
	h.run(t, Options{Boot: true, BootTimeout: 3 * time.Second})
	if h.bootBudget <= 0 || h.bootBudget > 3*time.Second {
		t.Errorf("trial boot given %v with --boot-timeout 3s", h.bootBudget)
	}
}

func TestClientHelperIdentity(t *testing.T) {
	h := healthyHost()
	delete(h.files, ClientHelperPath)
	c := wantStatus(t, h.run(t, Options{}), CheckClientHelper, StatusWarn)
	wantContains(t, "detail", c.Detail, "no helper at "+ClientHelperPath)
	wantContains(t, "fix", c.Fix, "--client-helper")

	h.files[ClientHelperPath] = fakeFile{mode: 0o755, data: []byte("official helper")}
	c = wantStatus(t, h.run(t, Options{}), CheckClientHelper, StatusWarn)
	wantContains(t, "detail", c.Detail, "official helper")
	wantContains(t, "fix", c.Fix, "install-client-helper.sh install", "after every client update")

	h.files[ClientHelperPath] = h.files[h.exe]
	h.files[ClientHelperPath+BackupSuffix] = fakeFile{mode: 0o755, data: []byte("official helper")}
	c = wantStatus(t, h.run(t, Options{}), CheckClientHelper, StatusOK)
	wantContains(t, "detail", c.Detail, "this cowork-vmm binary", BackupSuffix)

	h.files[ClientHelperPath] = fakeFile{mode: 0o755, data: []byte("cowork-vmm older build")}
	c = wantStatus(t, h.run(t, Options{}), CheckClientHelper, StatusWarn)
	wantContains(t, "detail", c.Detail, "cowork-vmm build", "v0.0.9")

	other := "/opt/claude/cowork-linux-helper"
	h.files[other] = h.files[h.exe]
	c = wantStatus(t, h.run(t, Options{ClientHelperPath: other}), CheckClientHelper, StatusOK)
	wantContains(t, "detail", c.Detail, other)
}

func TestClientGate(t *testing.T) {
	h := healthyHost()
	delete(h.path, "qemu-system-x86_64")
	delete(h.files, "/usr/libexec/virtiofsd")
	h.files["/usr/lib/qemu/virtiofsd"] = fakeFile{mode: 0o755}
	delete(h.files, "/usr/share/OVMF/OVMF_VARS_4M.fd")
	delete(h.files, "/dev/vhost-vsock")
	r := h.run(t, Options{})
	q := wantStatus(t, r, CheckGateQEMU, StatusFail)
	wantContains(t, "qemu", q.Detail+q.Fix, "virtualization_tools_missing", "apt install qemu-system-x86")
	fw := wantStatus(t, r, CheckGateFirmware, StatusFail)
	wantContains(t, "firmware fix", fw.Fix, "apt install ovmf")
	v := wantStatus(t, r, CheckGateVirtiofsd, StatusFail)
	wantContains(t, "virtiofsd", v.Detail+v.Fix, "/usr/lib/qemu/virtiofsd", "ln -s /usr/lib/qemu/virtiofsd /usr/libexec/virtiofsd")
	vs := wantStatus(t, r, CheckGateVhostVsock, StatusFail)
	wantContains(t, "vhost-vsock", vs.Detail+vs.Fix, "vhost_vsock_module_missing", "modprobe vhost_vsock")
	if r.Verdict.ClientGatePasses {
		t.Error("gate said to pass")
	}
	wantContains(t, "gate conclusion", r.Verdict.ClientGate, "unsupported", "virtualization_tools_missing", "vhost_vsock_module_missing")
	if r.ExitCode() != 0 {
		t.Errorf("exit %d: the client's gate must not change doctor's exit status", r.ExitCode())
	}

	// The older OVMF pair counts when the 4M pair is incomplete.
	h.files["/usr/share/OVMF/OVMF_CODE.fd"] = fakeFile{mode: 0o644}
	h.files["/usr/share/OVMF/OVMF_VARS.fd"] = fakeFile{mode: 0o644}
	// A qemu only a login shell's PATH has.
	h.path["qemu-system-x86_64"] = "/opt/qemu/bin/qemu-system-x86_64"
	r = h.run(t, Options{})
	wantStatus(t, r, CheckGateFirmware, StatusOK)
	q = wantStatus(t, r, CheckGateQEMU, StatusWarn)
	wantContains(t, "qemu fix", q.Fix, "ln -s /opt/qemu/bin/qemu-system-x86_64 /usr/local/bin/")

	vsock := fakeFile{mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, noAccess: true}
	h.files["/dev/vhost-vsock"] = vsock
	vs = wantStatus(t, h.run(t, Options{}), CheckGateVhostVsock, StatusFail)
	wantContains(t, "vhost-vsock fix", vs.Fix, `KERNEL=="vhost-vsock"`)
}

func TestRootIsWarned(t *testing.T) {
	h := healthyHost()
	h.uid = 0
	h.files["/run/user/1000"] = fakeFile{mode: fs.ModeDir | 0o700, uid: 0}
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckUser, StatusWarn)
	wantContains(t, "fix", c.Fix, "as the user who runs Claude Desktop")
	u := wantStatus(t, r, CheckUserNS, StatusOK)
	wantContains(t, "detail", u.Detail, "as root")
}

func TestJSONFieldNames(t *testing.T) {
	h := healthyHost()
	delete(h.files, "/dev/kvm")
	var out, errOut bytes.Buffer
	code := runMain(context.Background(), []string{"--json"}, &out, &errOut, h.host())
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	var checks []map[string]any
	if err := json.Unmarshal(doc["checks"], &checks); err != nil || len(checks) == 0 {
		t.Fatalf("checks: %v (%d)", err, len(checks))
	}
	for _, c := range checks {
		for _, k := range []string{"id", "group", "title", "status", "detail", "fix"} {
			if _, ok := c[k]; !ok {
				t.Errorf("check %v has no %q field", c["id"], k)
			}
		}
	}
	var verdict map[string]any
	if err := json.Unmarshal(doc["verdict"], &verdict); err != nil {
		t.Fatal(err)
	}
	if verdict["defaultBackendWorks"] != false {
		t.Errorf("defaultBackendWorks = %v, want false", verdict["defaultBackendWorks"])
	}
	usable, ok := verdict["usableBackends"].([]any)
	if !ok || len(usable) != 1 || usable[0] != BackendProcess {
		t.Errorf("usableBackends = %v, want [process]", verdict["usableBackends"])
	}
}

func TestTextOutput(t *testing.T) {
	h := healthyHost()
	h.kvm = kvm.HostProbe{OpenErr: fmt.Errorf("%w: denied", kvm.ErrKVMPermission)}
	var out, errOut bytes.Buffer
	code := runMain(context.Background(), nil, &out, &errOut, h.host())
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	text := out.String()
	lines := strings.Split(text, "\n")
	// Every check's detail starts in the same column.
	rep := Run(context.Background(), Options{Host: h.host()})
	col := -1
	for _, c := range rep.Checks {
		found := false
		for _, l := range lines {
			prefix, _, ok := strings.Cut(l, "  "+c.Detail)
			if !ok || !strings.HasPrefix(l, "  "+symbol(c.Status)+" "+c.Title) {
				continue
			}
			found = true
			n := utf8.RuneCountInString(prefix)
			if col == -1 {
				col = n
			} else if n != col {
				t.Errorf("%s: detail at column %d, others at %d:\n%s", c.ID, n, col, l)
			}
		}
		if !found {
			t.Errorf("%s: no line shows %q", c.ID, c.Detail)
		}
	}
	wantContains(t, "text", text, "✗ KVM access", "fix: add yourself to the kvm group", "Verdict:", "What Claude Desktop's support gate checks")
	fixLine := ""
	for _, l := range lines {
		if strings.Contains(l, "fix: add yourself") {
			fixLine = l
		}
	}
	if !strings.HasPrefix(fixLine, "      ") {
		t.Errorf("fix line %q is not indented below its check", fixLine)
	}
}

func TestUsageErrors(t *testing.T) {
	var out, errOut bytes.Buffer
	h := healthyHost().host()
	if code := runMain(context.Background(), []string{"--nope"}, &out, &errOut, h); code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", code)
	}
	if code := runMain(context.Background(), []string{"extra"}, &out, &errOut, h); code != 2 {
		t.Errorf("extra argument: exit %d, want 2", code)
	}
	if code := runMain(context.Background(), []string{"-h"}, &out, &errOut, h); code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
}

func TestFileSharing(t *testing.T) {
	h := healthyHost()
	c := wantStatus(t, h.run(t, Options{}), CheckFileSharing, StatusOK)
	wantContains(t, "detail", c.Detail, "virtio-fs", "the default", "COWORK_VMM_FS=9p")

	h.env["COWORK_VMM_FS"] = "9p"
	c = wantStatus(t, h.run(t, Options{}), CheckFileSharing, StatusOK)
	wantContains(t, "detail", c.Detail, "virtio-9p", "COWORK_VMM_FS=9p")

	h.env["COWORK_VMM_FS"] = "nfs"
	r := h.run(t, Options{Boot: true})
	c = wantStatus(t, r, CheckFileSharing, StatusFail)
	wantContains(t, "detail", c.Detail, `COWORK_VMM_FS="nfs"`, `"virtiofs"`, `"9p"`)
	wantContains(t, "fix", c.Fix, "unset COWORK_VMM_FS")
	wantStatus(t, r, CheckBootKVM, StatusSkip)
	wantUsable(t, r, BackendProcess)
}

func TestWarmStart(t *testing.T) {
	h := healthyHost()
	cache := t.TempDir()
	h.env["XDG_CACHE_HOME"] = cache
	c := wantStatus(t, h.run(t, Options{}), CheckWarmStart, StatusOK)
	wantContains(t, "detail", c.Detail, "on, no snapshot yet", filepath.Join(cache, "cowork-vmm", "snapshots"), "COWORK_VMM_SNAPSHOT=off")

	dir := filepath.Join(cache, "cowork-vmm", "snapshots")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "abc.snap"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c = wantStatus(t, h.run(t, Options{}), CheckWarmStart, StatusOK)
	wantContains(t, "detail", c.Detail, "restores", "abc.snap")

	h.env["COWORK_VMM_SNAPSHOT"] = "off"
	c = wantStatus(t, h.run(t, Options{}), CheckWarmStart, StatusOK)
	wantContains(t, "detail", c.Detail, "off: every start boots cold")
}

// TestFileLimit: a helper's open-file limit below fdlimit.Low is worth a
// warning with a fix (file sharing holds a descriptor per looked-up file);
// above it the check passes and says how many there are.
func TestFileLimit(t *testing.T) {
	h := healthyHost()
	c := wantStatus(t, h.run(t, Options{}), CheckFileLimit, StatusOK)
	wantContains(t, "detail", c.Detail, "1048576 descriptors")
	h.fileLimit = 4096
	r := h.run(t, Options{})
	c = wantStatus(t, r, CheckFileLimit, StatusWarn)
	wantContains(t, "detail", c.Detail, "4096 descriptors", "Too many open files")
	wantContains(t, "fix", c.Fix, "LimitNOFILE=", "65536")
	wantUsable(t, r, BackendKVM, BackendProcess) // a warning, not a failure
}

// TestSuspendedGuests: doctor lists each profile's suspended guest with
// its size, its age and whether the next start resumes it.
func TestSuspendedGuests(t *testing.T) {
	fake := healthyHost()
	fake.env["XDG_CACHE_HOME"] = t.TempDir()
	data := t.TempDir()
	run := func() Report {
		h := fake.host()
		h.DataDir = func() (string, error) { return data, nil }
		return Run(context.Background(), Options{Host: h})
	}
	c := wantStatus(t, run(), CheckSuspended, StatusOK)
	wantContains(t, "detail", c.Detail, "none: stopVM saves a guest")

	saved := time.Now().Add(-90 * time.Second).UTC().Format(time.RFC3339Nano)
	for name, gen := range map[string]string{"current-0123": "3", "stale-4567": "4"} {
		dir := filepath.Join(data, "profiles", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		files := map[string]string{
			"suspended.json": `{"nonce":"ab","generation":3,"systemExports":{},"nextExport":2,"savedAt":"` + saved + `"}`,
			"suspended.snap": strings.Repeat("x", 1<<20),
			"vm-generation":  gen + "\n",
		}
		for f, content := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	c = wantStatus(t, run(), CheckSuspended, StatusOK)
	wantContains(t, "detail", c.Detail, "current-0123: 1.0 MiB, saved 1m3", "resumed by its next start",
		"stale-4567: 1.0 MiB, not resumed: the profile's guest ran after it was saved")

	fake.env["COWORK_VMM_SUSPEND"] = "off"
	c = wantStatus(t, run(), CheckSuspended, StatusOK)
	wantContains(t, "detail", c.Detail, "off: stopVM shuts guests down")
	delete(fake.env, "COWORK_VMM_SUSPEND")
	fake.env["COWORK_VMM_SNAPSHOT"] = "off"
	c = wantStatus(t, run(), CheckSuspended, StatusOK)
	wantContains(t, "detail", c.Detail, "off: stopVM shuts guests down")
}
