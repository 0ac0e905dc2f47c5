// Package x86 builds the x86-64 boot state of a Linux guest as plain data:
// the guest physical layout, the CPUID policy, the boot MSRs, the long-mode
// GDT and control registers, identity page tables, the e820 map, the Linux
// zero page (struct boot_params), the PVH start info and the Intel MP table;
// and it walks a guest's page tables (Paging.Translate, for the VMM's exit
// reports).
//
// It performs no ioctls and never imports the KVM layer: the VMM converts the
// plain structs here (CPUIDEntry, MSR, Segment, SystemRegisters, Registers)
// into KVM's. Everything that writes guest memory goes through GuestWriter
// (and the walk reads through GuestReader), so all of it is tested without
// /dev/kvm.
package x86
