// Package kvm is a thin, typed layer over the Linux KVM ioctl API for x86-64:
// one small documented method per ioctl, on typed handles (System for
// /dev/kvm, VM, VCPU) so that a VM descriptor and a vCPU descriptor can never
// be swapped by mistake.
//
// It owns the ioctl numbers, the Go mirrors of the kernel's structures (their
// sizes and field offsets are asserted in the tests against
// <linux/kvm.h>), error messages that name the fix when /dev/kvm is missing
// or not accessible, capability checks, and detection of PVM (a paravirtual
// KVM that cannot execute every guest instruction). It knows nothing of
// guest memory layout, devices or boot protocols: that is package vmm and its
// subpackages.
//
// Every ioctl except KVM_RUN is retried on EINTR. KVM_RUN returns EINTR to
// its caller, because that is how a vCPU is kicked out of the guest.
package kvm
