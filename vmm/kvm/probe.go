package kvm

import (
	"errors"
	"fmt"
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
	// Tried says the trial guest (see trialGuest) ran: it does once the
	// device is usable. TrialErr is how it differed from what a
	// hardware-assisted KVM does, or nil.
	Tried    bool
	TrialErr error
}

// ProbeHost probes the KVM behind device ("" = DevicePath): opens it the
// way the VMM does, reads the API version and capabilities, looks for the
// marks of PVM and, when everything else allows, runs a trial guest that
// executes what a Linux kernel's boot does and PVM's emulator cannot.
// It takes a few milliseconds and leaves nothing behind.
func ProbeHost(device string) HostProbe {
	if device == "" {
		device = DevicePath
	}
	p := HostProbe{Device: device}
	p.PVM, p.PVMReason = IsPVM()
	fd, err := unix.Open(device, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		p.OpenErr = openError(device, err)
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
	p.Capabilities = make(map[string]bool, len(RequiredCapabilities))
	for _, c := range RequiredCapabilities {
		n, err := sys.CheckExtension(c)
		if err != nil {
			p.CapabilitiesErr = fmt.Errorf("KVM_CHECK_EXTENSION %s: %w", c, err)
			return p
		}
		p.Capabilities[c.String()] = n > 0
	}
	if p.Usable() == nil {
		p.Tried = true
		p.TrialErr = trialGuest(sys)
	}
	return p
}

// MissingCapabilities names the required capabilities the probe found
// absent, in RequiredCapabilities' order.
func (p HostProbe) MissingCapabilities() []string {
	var missing []string
	for _, c := range RequiredCapabilities {
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
		return fmt.Errorf("%w: the trial guest was not run", ErrCannotBootLinux)
	case p.TrialErr != nil && p.PVM:
		return fmt.Errorf("%w: it is PVM, a paravirtual KVM inside another VM (%s): %w", ErrCannotBootLinux, p.PVMReason, p.TrialErr)
	case p.TrialErr != nil:
		return fmt.Errorf("%w: %w", ErrCannotBootLinux, p.TrialErr)
	}
	return nil
}
