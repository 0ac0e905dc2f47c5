// Package machine assembles a bootable micro-VM from the VMM (package
// vmm), the platform devices and the kernel loader, and offers virtio-mmio
// device slots. On x86-64 (machine_amd64.go) the platform is the 8250
// console on COM1, the i8042 for Linux's reset path and the boot timer
// port, and the loader is vmm/loader with the vmm/x86 table builders; on
// arm64 (machine_arm64.go) it is a 16550 console on MMIO, the boot timer's
// MMIO page, PSCI (served by KVM) for reset and power-off, and vmm/arm64's
// Image loader and device tree. It owns the machine's shape — which device sits at which
// port, address and interrupt, and the default kernel command line — and
// its lifecycle: New, Start, Wait, Stop, and RunKernel for the CLI; and
// its snapshots: Snapshot pauses a running machine and writes the VM, each
// virtio transport, the own state of each device that keeps one
// (virtio.StateSaver: virtio-fs's session), the caller's extra sections
// and the console to a file (package vmm/snapshot); Restore and
// StartRestored bring a machine of the same shape back from it with the
// same devices attached in the same order, each device given its own
// state before its transport activates it. A snapshot with no state for a
// device (older ones) restores it to start afresh.
//
// The machine has no firmware, no PCI and no ACPI: the kernel is entered
// directly. On x86-64 that is the 64-bit Linux boot protocol or PVH, CPUs
// and the IOAPIC are described by an MP table, and virtio devices are
// announced on the command line (virtio_mmio.device=4K@0x…:irq). On arm64
// it is the Image protocol with x0 at a device tree that describes the
// memory, vCPUs, the VM's GIC (v3, or v2 on a GICv2 host), timer, PSCI,
// console and every virtio device.
package machine
