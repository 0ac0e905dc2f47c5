package kvm

import (
	"errors"
	"fmt"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrCannotBootLinux matches (errors.Is) HostProbe.BootsLinux's answer when
// this host's KVM cannot boot a Linux guest, whatever the reason.
var ErrCannotBootLinux = errors.New("this host's KVM cannot boot a Linux guest")

// HostProbe is what probing a KVM device found: the one answer to "can
// this host's KVM boot Linux?" (BootsLinux) and the facts behind it, for
// doctor's report, the kvm backend's preflight and the tests' choice
// between booting directly, in the nested harness, or not at all.
type HostProbe struct {
	// Device is the node probed (DevicePath unless told otherwise).
	Device string
	// OpenErr is why the device could not be opened read-write (wrapping
	// ErrNoKVM or ErrKVMPermission when that is why), or nil.
	OpenErr error
	// APIVersion is KVM_GET_API_VERSION's answer; APIErr its failure.
	APIVersion int
	APIErr     error
	// Capabilities maps each of RequiredCapabilities' names to whether it
	// is present; CapabilitiesErr is a failed check.
	Capabilities    map[string]bool
	CapabilitiesErr error
	// PVM and PVMReason: the host shows a paravirtual KVM (IsPVM). They
	// are filled even when the device cannot be opened.
	PVM       bool
	PVMReason string
	// Tried says the trial ran: it does once the device is usable. On
	// amd64 it is a trial guest (see trialGuest), on arm64 the steps the
	// VMM takes to set a VM up (see trialARM64). TrialErr is how it
	// differed from what a KVM that boots Linux does, or nil.
	Tried    bool
	TrialErr error
	// Arch is the GOARCH whose KVM was probed; "" means runtime.GOARCH
	// (probes made by hand in tests).
	Arch string
	// ARM64 is what the arm64 trial found, nil elsewhere.
	ARM64 *ARM64Facts
}

// ARM64Facts is what the arm64 trial learnt of the KVM, for doctor.
type ARM64Facts struct {
	// Target is KVM_ARM_PREFERRED_TARGET's CPU model (ARMTargetName);
	// TargetOK says the ioctl answered.
	Target   uint32
	TargetOK bool
	// VCPUInit says a vCPU initialised with that target and PSCI 0.2.
	VCPUInit bool
	// GICv3 and GICv2 say the VM could create an in-kernel GICv3 or
	// GICv2 (the VMM uses the GICv3 when it can).
	GICv3, GICv2 bool
	// IPABits is the largest guest-physical address size the VMs may have
	// (KVM_CAP_ARM_VM_IPA_SIZE; 0 when not reported, i.e. 40 bits).
	IPABits int
}

// arch is the GOARCH the probe is about.
func (p HostProbe) arch() string {
	if p.Arch == "" {
		return runtime.GOARCH
	}
	return p.Arch
}

// Required is RequiredCapabilitiesFor the probe's architecture.
func (p HostProbe) Required() []Capability {
	return RequiredCapabilitiesFor(p.arch())
}

// ProbeHost probes the KVM behind device ("" = DevicePath): opens it the
// way the VMM does, reads the API version and capabilities, looks for the
// marks of PVM and, when everything else allows, runs the trial: on amd64
// a trial guest that executes what a Linux kernel's boot does and PVM's
// emulator cannot; on arm64 the preferred CPU target, a vCPU initialised
// with PSCI 0.2 and an in-kernel GIC, on a scratch VM. It takes a few milliseconds
// and leaves nothing behind.
func ProbeHost(device string) HostProbe {
	if device == "" {
		device = DevicePath
	}
	p := HostProbe{Device: device, Arch: runtime.GOARCH}
	p.PVM, p.PVMReason = IsPVM()
	fd, err := unix.Open(device, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		p.OpenErr = openErrorFor(p.Arch, device, err)
		return p
	}
	sys := &System{fd: fd}
	defer sys.Close()
	if p.APIVersion, p.APIErr = sys.GetAPIVersion(); p.APIErr != nil {
		p.APIErr = fmt.Errorf("KVM_GET_API_VERSION on %s: %w", device, p.APIErr)
		return p
	}
	if p.APIVersion != APIVersion {
		return p
	}
	required := p.Required()
	p.Capabilities = make(map[string]bool, len(required))
	for _, c := range required {
		n, err := sys.CheckExtension(c)
		if err != nil {
			p.CapabilitiesErr = fmt.Errorf("KVM_CHECK_EXTENSION %s: %w", c, err)
			return p
		}
		p.Capabilities[c.String()] = n > 0
	}
	if p.Usable() != nil {
		return p
	}
	p.Tried = true
	switch p.Arch {
	case "arm64":
		p.ARM64, p.TrialErr = trialARM64(sys)
	default:
		p.TrialErr = trialGuest(sys)
	}
	return p
}

// MissingCapabilities names the required capabilities the probe found
// absent, in Required's order.
func (p HostProbe) MissingCapabilities() []string {
	var missing []string
	for _, c := range p.Required() {
		if name := c.String(); p.Capabilities != nil && !p.Capabilities[name] {
			missing = append(missing, name)
		}
	}
	return missing
}

// Usable reports why the VMM cannot use this KVM at all (tiny guests
// included), or nil: the device opens, speaks API 12 and has every
// required capability.
func (p HostProbe) Usable() error {
	switch {
	case !supportedArch(p.arch()):
		return fmt.Errorf("the VMM runs guests on amd64 and arm64 KVM, not on %s", p.arch())
	case p.OpenErr != nil:
		return p.OpenErr
	case p.APIErr != nil:
		return p.APIErr
	case p.APIVersion != APIVersion:
		return fmt.Errorf("%s speaks KVM API version %d; this VMM needs %d", p.Device, p.APIVersion, APIVersion)
	case p.CapabilitiesErr != nil:
		return p.CapabilitiesErr
	}
	if missing := p.MissingCapabilities(); len(missing) > 0 {
		return fmt.Errorf("this kernel's KVM lacks %s, which the VMM needs; a newer host kernel is required",
			strings.Join(missing, ", "))
	}
	return nil
}

// BootsLinux is the answer: nil when this KVM can boot a Linux guest,
// otherwise an error wrapping ErrCannotBootLinux that says why. The trial
// guest decides; the marks of PVM only explain a failed trial.
func (p HostProbe) BootsLinux() error {
	if err := p.Usable(); err != nil {
		return fmt.Errorf("%w: %w", ErrCannotBootLinux, err)
	}
	switch {
	case !p.Tried:
		return fmt.Errorf("%w: the %s was not run", ErrCannotBootLinux, p.trialName())
	case p.TrialErr != nil && p.PVM:
		return fmt.Errorf("%w: it is PVM, a paravirtual KVM inside another VM (%s): %w", ErrCannotBootLinux, p.PVMReason, p.TrialErr)
	case p.TrialErr != nil:
		return fmt.Errorf("%w: %w", ErrCannotBootLinux, p.TrialErr)
	}
	return nil
}

// trialName says what the trial is on the probe's architecture.
func (p HostProbe) trialName() string {
	if p.arch() == "arm64" {
		return "arm64 trial (preferred target, vCPU init, GICv3 or GICv2)"
	}
	return "trial guest"
}
