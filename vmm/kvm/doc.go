// Package kvm is a thin, typed layer over the Linux KVM ioctl API for
// x86-64 and arm64: one small documented method per ioctl, on typed
// handles (System for /dev/kvm, VM, VCPU, Device for an in-kernel device
// such as arm64's GICv3) so that a VM descriptor and a vCPU descriptor can
// never be swapped by mistake.
//
// It owns the ioctl numbers, the Go mirrors of the kernel's structures (their
// sizes and field offsets are asserted in the tests against <linux/kvm.h>
// of each architecture), the arm64 register ids, error messages that name
// the fix when /dev/kvm is missing or not accessible, the capabilities
// each architecture requires, and the host probe (ProbeHost): on x86 the
// detection of PVM (a paravirtual KVM that cannot execute every guest
// instruction) with a trial guest, on arm64 a trial of the VM setup
// (preferred target, vCPU init with PSCI 0.2, GICv3). Both architectures'
// ioctls compile on every GOARCH (their numbers use the same generic
// encoding); one issued on the other architecture's KVM fails. It knows
// nothing of guest memory layout, devices or boot protocols: that is
// package vmm and its subpackages.
//
// Every ioctl except KVM_RUN is retried on EINTR. KVM_RUN returns EINTR to
// its caller, because that is how a vCPU is kicked out of the guest.
package kvm
