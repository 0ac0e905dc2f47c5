package kvm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// DevicePath is where the KVM device node lives.
const DevicePath = "/dev/kvm"

// ErrNoKVM matches (errors.Is) the error from Open when /dev/kvm is missing.
var ErrNoKVM = errors.New("no KVM device")

// ErrKVMPermission matches (errors.Is) the error from Open when /dev/kvm
// exists but this user may not open it.
var ErrKVMPermission = errors.New("no permission to use KVM")

// System is an open /dev/kvm: the system-wide KVM handle.
type System struct {
	fd int
}

// Open opens /dev/kvm, checks the API version is 12 and that every
// capability in RequiredCapabilities is present. Its errors say what to do:
// load the module, join the kvm group, or which capabilities are missing.
func Open() (*System, error) {
	return OpenPath(DevicePath)
}

// OpenPath is Open on another device node path (for tests and odd hosts).
func OpenPath(path string) (*System, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, openErrorFor(runtime.GOARCH, path, err)
	}
	s := &System{fd: fd}
	v, err := s.GetAPIVersion()
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("KVM_GET_API_VERSION on %s: %w", path, err)
	}
	if v != APIVersion {
		s.Close()
		return nil, fmt.Errorf("%s speaks KVM API version %d; this VMM needs %d", path, v, APIVersion)
	}
	if err := s.RequireCapabilities(RequiredCapabilities...); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// openErrorFor turns an open(2) failure on the KVM device into an
// actionable error for a host of architecture goarch.
func openErrorFor(goarch, path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
		if goarch == "arm64" {
			return fmt.Errorf("%w: %s does not exist (%v): arm64 KVM needs a host kernel "+
				"started at EL2 (hypervisor mode) with KVM built in; `dmesg | grep kvm` then says "+
				"\"VHE mode initialized\" or \"Hyp mode initialized\"; in a cloud VM, "+
				"use a bare-metal instance or one with nested virtualization", ErrNoKVM, path, err)
		}
		return fmt.Errorf("%w: %s does not exist (%v): load the KVM module "+
			"(sudo modprobe kvm_intel or sudo modprobe kvm_amd) and check that "+
			"virtualization (VT-x/AMD-V) is enabled in the BIOS/UEFI or, in a cloud VM, "+
			"that nested virtualization is enabled", ErrNoKVM, path, err)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w: cannot open %s (%v): add yourself to the kvm group "+
			"(sudo usermod -aG kvm $USER, then log in again) or install a udev rule "+
			`KERNEL=="kvm", GROUP="kvm", MODE="0660"`, ErrKVMPermission, path, err)
	default:
		return fmt.Errorf("open %s: %w", path, err)
	}
}

// Close closes /dev/kvm. VMs created from it stay valid.
func (s *System) Close() error {
	if s == nil || s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}

// GetAPIVersion issues KVM_GET_API_VERSION.
func (s *System) GetAPIVersion() (int, error) {
	r, err := ioctlValue(s.fd, ioctlGetAPIVersion, 0)
	return int(r), err
}

// CheckExtension issues KVM_CHECK_EXTENSION; 0 means absent, a positive value
// is present (some capabilities return a count or limit).
func (s *System) CheckExtension(c Capability) (int, error) {
	r, err := ioctlValue(s.fd, ioctlCheckExtension, uintptr(c))
	return int(r), err
}

// RequireCapabilities returns an error naming every capability that is absent.
func (s *System) RequireCapabilities(caps ...Capability) error {
	return missingCapabilities(caps, s.CheckExtension)
}

func missingCapabilities(caps []Capability, check func(Capability) (int, error)) error {
	var missing []string
	for _, c := range caps {
		n, err := check(c)
		if err != nil {
			return fmt.Errorf("KVM_CHECK_EXTENSION %s: %w", c, err)
		}
		if n <= 0 {
			missing = append(missing, c.String())
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("this kernel's KVM lacks %s, which the VMM needs; a newer host kernel is required",
			strings.Join(missing, ", "))
	}
	return nil
}

// GetVCPUMmapSize issues KVM_GET_VCPU_MMAP_SIZE: the size of a vCPU's
// shared kvm_run area.
func (s *System) GetVCPUMmapSize() (int, error) {
	r, err := ioctlValue(s.fd, ioctlGetVCPUMmapSize, 0)
	return int(r), err
}

// GetSupportedCPUID issues KVM_GET_SUPPORTED_CPUID: the CPUID leaves and
// bits this KVM can expose to a guest. Never pass it through unfiltered.
func (s *System) GetSupportedCPUID() ([]CPUIDEntry, error) {
	arg := new(cpuid2Arg)
	arg.Nent = maxCPUIDEntries
	if _, err := ioctlStruct(s.fd, ioctlGetSupportedCPUID, arg); err != nil {
		return nil, fmt.Errorf("KVM_GET_SUPPORTED_CPUID: %w", err)
	}
	if arg.Nent > maxCPUIDEntries {
		return nil, fmt.Errorf("KVM_GET_SUPPORTED_CPUID returned %d entries, more than %d", arg.Nent, maxCPUIDEntries)
	}
	return append([]CPUIDEntry(nil), arg.Entries[:arg.Nent]...), nil
}

// CreateVM issues KVM_CREATE_VM (default machine type).
func (s *System) CreateVM() (*VM, error) {
	r, err := ioctlValue(s.fd, ioctlCreateVM, 0)
	if err != nil {
		return nil, fmt.Errorf("KVM_CREATE_VM: %w", err)
	}
	// The kernel's anon-inode fds are O_CLOEXEC already (KVM uses O_CLOEXEC
	// for VM and vCPU fds since Linux 3.x), nothing to set.
	mmapSize, err := s.GetVCPUMmapSize()
	if err != nil {
		unix.Close(int(r))
		return nil, fmt.Errorf("KVM_GET_VCPU_MMAP_SIZE: %w", err)
	}
	return &VM{fd: int(r), vcpuMmapSize: mmapSize}, nil
}

// IsPVM reports whether this KVM is PVM, a paravirtual KVM running inside
// another VM: its instruction emulator executes guest kernel code and
// cannot run cmpxchg16b, xsave or int3 in protected mode, so a stock Linux
// guest cannot boot on it. Reason says what gave it away.
func IsPVM() (pvm bool, reason string) {
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	_, moduleErr := os.Stat("/sys/module/kvm_pvm")
	return detectPVM(runtime.GOARCH, moduleErr == nil, string(cpuinfo))
}

// detectPVM decides from the presence of the kvm_pvm module and the host's
// CPU flags. Without VMX or SVM the only KVM that can exist is a
// paravirtual one. PVM is x86 only: an arm64 CPU has neither flag (its
// cpuinfo has no "flags" line at all) and its KVM is never PVM.
func detectPVM(goarch string, pvmModuleLoaded bool, cpuinfo string) (bool, string) {
	if goarch != "amd64" {
		return false, ""
	}
	if pvmModuleLoaded {
		return true, "the kvm_pvm module is loaded"
	}
	if cpuinfo == "" {
		return false, ""
	}
	hasVirt := false
	for _, line := range strings.Split(cpuinfo, "\n") {
		if !strings.HasPrefix(line, "flags") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if f == "vmx" || f == "svm" {
				hasVirt = true
			}
		}
		break
	}
	if !hasVirt {
		return true, "the CPU has neither vmx nor svm, so KVM can only be paravirtual"
	}
	return false, ""
}
