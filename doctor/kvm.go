package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/cowork-vmm/cowork-vmm/vmm/arm64"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// Paths doctor looks at for KVM.
const (
	kvmMiscDir   = "/sys/class/misc/kvm" // present when KVM registered /dev/kvm
	pvmModuleDir = "/sys/module/kvm_pvm"
	cpuinfoPath  = "/proc/cpuinfo"
)

const processHint = "use COWORK_VMM_BACKEND=process (guests run as namespaced host processes, no VM isolation)"

const kvmGroupFix = "add yourself to the kvm group: sudo usermod -aG kvm $USER, then log out and back in (check with `id -nG`); " +
	`or give the kvm group access with a udev rule: echo 'KERNEL=="kvm", GROUP="kvm", MODE="0660"' | sudo tee /etc/udev/rules.d/65-kvm.rules && sudo udevadm control --reload && sudo udevadm trigger`

// kvmFacts is what the KVM checks learn, for the verdict and later checks.
type kvmFacts struct {
	devicePresent bool
	accessOK      bool
	apiOK         bool
	capsOK        bool
	linuxOK       bool // this KVM can boot a Linux guest
	pvm           bool
	pvmReason     string
}

// works says whether everything KVM-side lets the kvm backend run.
func (f kvmFacts) works() bool {
	return f.devicePresent && f.accessOK && f.apiOK && f.capsOK && f.linuxOK
}

// cpuVirt reads the first "flags" line of /proc/cpuinfo: which of vmx/svm
// the CPU shows ("" for neither) and whether the flags could be read.
func cpuVirt(cpuinfo []byte) (flag string, known bool) {
	for line := range strings.SplitSeq(string(cpuinfo), "\n") {
		if !strings.HasPrefix(line, "flags") {
			continue
		}
		fields := strings.Fields(line)
		for _, f := range []string{"vmx", "svm"} {
			if slices.Contains(fields, f) {
				return f, true
			}
		}
		return "", true
	}
	return "", false
}

func (r *runner) kvmChecks() kvmFacts {
	var f kvmFacts
	h := r.h
	p := h.ProbeKVM(kvm.DevicePath)
	f.pvm, f.pvmReason = p.PVM, p.PVMReason
	cpuinfo, _ := h.ReadFile(cpuinfoPath)
	virtFlag, virtKnown := cpuVirt(cpuinfo)
	_, pvmErr := h.Stat(pvmModuleDir)
	pvmModule := pvmErr == nil

	// /dev/kvm present.
	dev := Check{ID: CheckKVMDevice, Group: GroupCoworkVMM, Title: "KVM device"}
	info, err := h.Stat(kvm.DevicePath)
	switch {
	case err != nil && errors.Is(err, fs.ErrNotExist):
		dev.Status = StatusFail
		dev.Detail, dev.Fix = r.noKVMDevice(pvmModule, virtFlag, virtKnown)
	case err != nil:
		dev.Status = StatusFail
		dev.Detail = fmt.Sprintf("cannot look at %s: %v", kvm.DevicePath, err)
		dev.Fix = "run doctor as the user who runs Claude Desktop; " + processHint
	case info.Mode()&fs.ModeCharDevice == 0:
		dev.Status = StatusFail
		dev.Detail = fmt.Sprintf("%s exists but is not a character device (%v)", kvm.DevicePath, info.Mode())
		dev.Fix = fmt.Sprintf("remove it (sudo rm %s) and reload KVM (sudo modprobe -r kvm_intel kvm_amd; sudo modprobe kvm_intel or kvm_amd)", kvm.DevicePath)
		if r.h.Arch == "arm64" {
			dev.Fix = fmt.Sprintf("remove it (sudo rm %s) and recreate the node: sudo udevadm trigger (KVM is built into arm64 kernels; no module to reload)", kvm.DevicePath)
		}
	default:
		f.devicePresent = true
		dev.Status = StatusOK
		dev.Detail = fmt.Sprintf("%s exists (%v%s)", kvm.DevicePath, info.Mode().Perm(), ownerString(info))
	}
	r.add(dev)

	// Openable read-write by us, API version, capabilities.
	access := Check{ID: CheckKVMAccess, Group: GroupCoworkVMM, Title: "KVM access"}
	api := Check{ID: CheckKVMAPI, Group: GroupCoworkVMM, Title: "KVM API version"}
	caps := Check{ID: CheckKVMCaps, Group: GroupCoworkVMM, Title: "KVM capabilities"}
	if !f.devicePresent {
		skipAll("no KVM device (see above)", &access, &api, &caps)
	} else {
		switch {
		case p.OpenErr != nil && errors.Is(p.OpenErr, kvm.ErrKVMPermission):
			access.Status = StatusFail
			access.Detail = fmt.Sprintf("%s exists but uid %d may not open it read-write", kvm.DevicePath, h.Getuid())
			access.Fix = kvmGroupFix
			if group, ok := r.staleGroupMembership(info); ok {
				access.Detail += fmt.Sprintf("; you are a member of its group %s in /etc/group, but this login session started before you were added", group)
				access.Fix = fmt.Sprintf("log out and back in (or start a shell with the group: newgrp %s); Claude Desktop must be started from the new session", group)
			}
		case p.OpenErr != nil && errors.Is(p.OpenErr, kvm.ErrNoKVM):
			access.Status = StatusFail
			access.Detail = fmt.Sprintf("%s exists but no KVM answers behind it: %v", kvm.DevicePath, p.OpenErr)
			access.Fix = "load the KVM module: sudo modprobe kvm_intel (Intel) or sudo modprobe kvm_amd (AMD); or " + processHint
			if r.h.Arch == "arm64" {
				access.Fix = arm64EL2Fix
			}
		case p.OpenErr != nil:
			access.Status = StatusFail
			access.Detail = p.OpenErr.Error()
			access.Fix = processHint
		default:
			f.accessOK = true
			access.Status = StatusOK
			access.Detail = fmt.Sprintf("uid %d opens %s read-write", h.Getuid(), kvm.DevicePath)
		}
		if !f.accessOK {
			skipAll("cannot open the KVM device", &api, &caps)
		} else {
			switch {
			case p.APIErr != nil:
				api.Status = StatusFail
				api.Detail = p.APIErr.Error()
				api.Fix = processHint
			case p.APIVersion != kvm.APIVersion:
				api.Status = StatusFail
				api.Detail = fmt.Sprintf("KVM speaks API version %d; cowork-vmm needs %d", p.APIVersion, kvm.APIVersion)
				api.Fix = "update the host kernel; or " + processHint
			default:
				f.apiOK = true
				api.Status = StatusOK
				api.Detail = fmt.Sprintf("KVM API version %d", p.APIVersion)
			}
			if !f.apiOK {
				skipAll("the KVM API version is not usable", &caps)
			} else {
				f.capsOK = r.capabilities(&caps, p)
			}
		}
	}
	r.add(access)
	r.add(api)
	r.add(caps)

	r.add(r.linuxCheck(&f, p, virtFlag, virtKnown))
	return f
}

// arm64EL2Fix is what makes an arm64 KVM appear: the kernel must start at
// EL2, which firmware or the hypervisor under a VM decides.
const arm64EL2Fix = "arm64 KVM is built into the kernel and needs it started at EL2 (hypervisor mode): " +
	"`sudo dmesg | grep -i kvm` says \"VHE mode initialized\" or \"Hyp mode initialized\" when it was, \"HYP mode not available\" when not; " +
	"in a cloud VM use a bare-metal instance or one with nested virtualization, on a board firmware that starts Linux at EL2; otherwise " + processHint

// linuxCheck answers "can this KVM boot Linux?": the probe's trial
// decides where the device is usable; otherwise what the host shows.
func (r *runner) linuxCheck(f *kvmFacts, p kvm.HostProbe, virtFlag string, virtKnown bool) Check {
	if r.h.Arch == "arm64" {
		return arm64LinuxCheck(f, p)
	}
	linux := Check{ID: CheckKVMLinux, Group: GroupCoworkVMM, Title: "Linux guests on this KVM"}
	const isolationFix = "; for VM isolation, run on a host with hardware virtualization (VT-x/AMD-V) or with nested virtualization enabled"
	switch {
	case f.capsOK:
		if err := p.BootsLinux(); err != nil {
			linux.Status = StatusFail
			linux.Detail = err.Error()
			linux.Fix = processHint + isolationFix
			break
		}
		f.linuxOK = true
		linux.Status = StatusOK
		linux.Detail = "a trial guest ran int3 in protected mode as a hardware-assisted KVM does: this KVM boots Linux guests"
	case f.pvm:
		linux.Status = StatusFail
		linux.Detail = fmt.Sprintf("%v: it is PVM, a paravirtual KVM inside another VM (%s), "+
			"whose instruction emulator fails on code every Linux kernel runs at boot", kvm.ErrCannotBootLinux, f.pvmReason)
		if !f.devicePresent {
			linux.Detail += "; here it does not even provide /dev/kvm"
		}
		linux.Fix = processHint + isolationFix
	case virtKnown && virtFlag != "":
		f.linuxOK = true
		linux.Status = StatusOK
		linux.Detail = fmt.Sprintf("the CPU has %s: a hardware-assisted KVM, which boots Linux guests", virtFlag)
		if !f.devicePresent {
			linux.Detail += " once /dev/kvm is there"
		}
	default:
		// No usable device, neither PVM nor a visible vmx/svm flag
		// (cpuinfo unreadable): nothing says it cannot.
		f.linuxOK = true
		linux.Status = StatusWarn
		linux.Detail = "could not read the CPU's flags from /proc/cpuinfo; nothing indicates a paravirtual KVM"
		linux.Fix = "run `cowork-vmm doctor --boot` to try a real boot"
	}
	return linux
}

// arm64LinuxCheck is linuxCheck on arm64, where there is no PVM: the
// probe's arm64 trial (preferred target, vCPU init with PSCI 0.2, an
// in-kernel GICv3 or GICv2) decides, and without a usable device there is
// nothing to tell.
func arm64LinuxCheck(f *kvmFacts, p kvm.HostProbe) Check {
	linux := Check{ID: CheckKVMLinux, Group: GroupCoworkVMM, Title: "Linux guests on this KVM"}
	if !f.capsOK {
		skipAll("the KVM device is not usable (see above)", &linux)
		return linux
	}
	if err := p.BootsLinux(); err != nil {
		linux.Status = StatusFail
		linux.Detail = err.Error()
		linux.Fix = "the VMM needs KVM_ARM_PREFERRED_TARGET and an in-kernel GIC (a GICv3, or a GICv2 on a GICv2 host); update the host kernel; or " + processHint
		return linux
	}
	f.linuxOK = true
	linux.Status = StatusOK
	linux.Detail = "arm64 KVM: " + arm64Facts(p.ARM64) + ": this KVM boots Linux guests"
	return linux
}

// arm64Facts says what the arm64 trial found.
func arm64Facts(a *kvm.ARM64Facts) string {
	if a == nil {
		return "the arm64 trial passed"
	}
	gic := "a GICv3"
	if !a.GICv3 && a.GICv2 {
		gic = fmt.Sprintf("a GICv2 (at most %d vCPUs)", arm64.MaxCPUsGICv2)
	}
	s := fmt.Sprintf("preferred CPU target %d (%s), a vCPU initialised with PSCI 0.2, %s can be created", a.Target, kvm.ARMTargetName(a.Target), gic)
	if a.IPABits > 0 {
		s += fmt.Sprintf(", guest physical addresses up to %d bits", a.IPABits)
	}
	return s
}

// noKVMDevice explains a missing /dev/kvm from what the host shows.
func (r *runner) noKVMDevice(pvmModule bool, virtFlag string, virtKnown bool) (detail, fix string) {
	h := r.h
	if _, err := h.Stat(kvmMiscDir); err == nil {
		devNum := "10:232"
		if b, err := h.ReadFile(kvmMiscDir + "/dev"); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			devNum = strings.TrimSpace(string(b))
		}
		major, minor, _ := strings.Cut(devNum, ":")
		return fmt.Sprintf("%s does not exist although KVM registered its device (%s, %s): the device node was not created", kvm.DevicePath, kvmMiscDir, devNum),
			fmt.Sprintf("sudo udevadm trigger, or create it: sudo mknod -m 0660 %s c %s %s && sudo chgrp kvm %s", kvm.DevicePath, major, minor, kvm.DevicePath)
	}
	if h.Arch == "arm64" {
		return fmt.Sprintf("%s does not exist: this arm64 kernel did not start KVM", kvm.DevicePath), arm64EL2Fix
	}
	switch {
	case pvmModule:
		detail = fmt.Sprintf("%s does not exist: the kvm_pvm module (PVM, a paravirtual KVM for VMs without nested virtualization) is loaded but registered no KVM device", kvm.DevicePath)
		if virtKnown && virtFlag == "" {
			detail += ", and the CPU has no vmx/svm, so no hardware KVM can load either"
		}
		fix = "this machine is a VM without nested virtualization: enable nested virtualization for it in its hypervisor or cloud settings " +
			"(kvm_intel or kvm_amd then provides /dev/kvm); even with a device node PVM cannot boot Linux guests; meanwhile " + processHint
	case virtKnown && virtFlag == "":
		detail = fmt.Sprintf("%s does not exist and the CPU shows no vmx/svm flag: virtualization is off in the firmware, or this is a VM without nested virtualization", kvm.DevicePath)
		fix = "enable VT-x/AMD-V (SVM) in the BIOS/UEFI; in a cloud VM or Crostini, enable nested virtualization; otherwise " + processHint
	case virtKnown:
		module := "kvm_intel"
		if virtFlag == "svm" {
			module = "kvm_amd"
		}
		detail = fmt.Sprintf("%s does not exist although the CPU has %s: the KVM module is not loaded", kvm.DevicePath, virtFlag)
		fix = fmt.Sprintf("sudo modprobe %s (to load it at boot: echo %s | sudo tee /etc/modules-load.d/kvm.conf); if it fails, enable virtualization in the BIOS/UEFI", module, module)
	default:
		detail = fmt.Sprintf("%s does not exist", kvm.DevicePath)
		fix = "load the KVM module (sudo modprobe kvm_intel or sudo modprobe kvm_amd) and enable virtualization in the BIOS/UEFI; in a cloud VM or Crostini, enable nested virtualization; otherwise " + processHint
	}
	return detail, fix
}

// staleGroupMembership reports the device's group name when /etc/group
// lists us in it but this process does not have it: the classic "added to
// the kvm group, did not log in again".
func (r *runner) staleGroupMembership(info fs.FileInfo) (string, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return "", false
	}
	gid := int(st.Gid)
	groups, err := r.h.Getgroups()
	if err != nil || slices.Contains(groups, gid) || r.h.Getgid() == gid {
		return "", false
	}
	name := userName(r.h, r.h.Getuid())
	if name == "" {
		return "", false
	}
	etcGroup, err := r.h.ReadFile("/etc/group")
	if err != nil {
		return "", false
	}
	for line := range strings.SplitSeq(string(etcGroup), "\n") {
		f := strings.Split(line, ":")
		if len(f) != 4 || f[2] != strconv.Itoa(gid) {
			continue
		}
		if slices.Contains(strings.Split(f[3], ","), name) {
			return f[0], true
		}
	}
	return "", false
}

// userName is uid's login name from /etc/passwd ("" if not found).
func userName(h Host, uid int) string {
	passwd, err := h.ReadFile("/etc/passwd")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(passwd), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 && f[2] == strconv.Itoa(uid) {
			return f[0]
		}
	}
	return ""
}

// capabilities fills the capabilities check from the probe.
func (r *runner) capabilities(c *Check, p kvm.HostProbe) bool {
	if p.CapabilitiesErr != nil {
		c.Status = StatusFail
		c.Detail = p.CapabilitiesErr.Error()
		c.Fix = "update the host kernel (KVM gained these capabilities long ago: Linux 5.x has them all); or " + processHint
		return false
	}
	var have, missing []string
	for _, capability := range p.Required() {
		name := capability.String()
		if p.Capabilities[name] {
			have = append(have, name)
		} else {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		c.Status = StatusFail
		c.Detail = "this KVM lacks " + strings.Join(missing, ", ")
		c.Fix = "update the host kernel; or " + processHint
		return false
	}
	c.Status = StatusOK
	c.Detail = "all required: " + strings.Join(have, ", ")
	return true
}

func skipAll(reason string, checks ...*Check) {
	for _, c := range checks {
		c.Status = StatusSkip
		c.Detail = "not checked: " + reason
	}
}

// ownerString is ", owner uid:gid" from info, when the platform says.
func ownerString(info fs.FileInfo) string {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf(", owner %d:%d", st.Uid, st.Gid)
	}
	return ""
}

// owner returns info's uid, if known.
func owner(info fs.FileInfo) (uid int, ok bool) {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), true
	}
	return 0, false
}
