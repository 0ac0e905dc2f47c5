// Package vmm runs a KVM virtual machine: guest memory, the port-I/O and
// MMIO buses devices register on, interrupt lines, one OS thread per vCPU
// running the KVM_RUN loop, and the lifecycle (Start, Wait, Stop) that ends
// with every thread joined, every fd closed and all memory unmapped.
//
// It owns the run loop and the exits — port I/O (including string I/O),
// MMIO, shutdown (triple fault), entry failures, KVM internal errors
// (reported the way qemu prints them), system events — and turns each into
// either a bus access or a reason the VM ended ([Exit]). It knows nothing of
// what any device does (it imports no device package), nor of boot
// protocols: CPUID policy, page tables, boot parameters and kernel loading
// live in vmm/x86 and vmm/loader (arm64: layout, device tree and Image
// loading in vmm/arm64), and package machine assembles a bootable micro-VM
// from all of them. The ioctls themselves are in vmm/kvm.
//
// Architectures: what differs is in _amd64.go and _arm64.go files: the
// VM's creation (x86: TSS, identity map, irqchip and PIT before the vCPUs,
// CPUID, MSRs and LINT pins per vCPU; arm64: vCPUs of KVM's preferred
// target with PSCI 0.2, secondaries powered off, then the in-kernel GICv3,
// or a GICv2 where KVM has no GICv3),
// the RAM layout (x86: split around the 32-bit MMIO hole; arm64: one
// region from 2 GiB), KVM_IRQ_LINE's numbering (arm64: SPIs), the boot
// registers, the register dump of an exit report, and the saved state
// (x86: the vCPUs' register ioctls, PIC, IOAPIC, PIT and KVM clock; arm64:
// every register KVM_GET_REG_LIST lists and the GIC's register groups,
// armstate.go, restored in the order armsave.go and armgicv2.go explain).
//
// Kicking a vCPU: RequestExit sets kvm_run.immediate_exit on every vCPU, so
// a vCPU not currently in KVM_RUN leaves at its next entry, then sends a
// real-time signal (kickSignal, SIGRTMIN+8) with tgkill to each vCPU thread,
// so a vCPU inside KVM_RUN (running guest code or halted) returns EINTR.
// The Go runtime installs its handler for every real-time signal and
// ignores one the program did not ask for, so the kick never kills the
// process and does not disturb the program's own signal handling. While a
// vCPU runs the guest, KVM_SET_SIGNAL_MASK lets only the kick (and the
// runtime's all-threads system call signal) through: the runtime's own
// preemption signal, SIGURG, which sysmon sends to a thread 10 ms into a
// system call, would otherwise be an exit for nothing several times a
// second per vCPU. The kick is repeated every 100 ms until the threads
// have returned, a guard against a signal lost to something outside the
// package.
//
// Doorbells: OnMMIOWrite registers a KVM ioeventfd, so a guest write of one
// value to one address (a virtqueue notify) signals an eventfd in the
// kernel instead of exiting to the vCPU thread, and a goroutine parked in
// Go's poller on that eventfd runs the handler. A notify then costs the
// guest no exit, and the device's worker is woken by a thread that is
// free to run it rather than stolen from the vCPU thread, which went back
// into KVM_RUN (on a nested KVM with coarse timers that steal cost a 4 ms
// tick per request).
//
// Snapshots: Pause parks every vCPU thread after a KVM_RUN that returned
// EINTR (the kick), which KVM enters only to complete the exit last served,
// so the state SaveState reads (registers, FPU/XSAVE, MSRs, LAPIC, events,
// irqchip, PIT, clock, and the CPUID table each vCPU ran with) is whole;
// RestoreState gives it to a fresh VM of the same configuration before
// Start (refusing, with snapshot.ErrMismatch, vCPUs given another CPUID
// table: the guest chose its code and XSAVE layout by it), and Resume lets
// a paused VM go on. WriteSnapshot writes the state and guest RAM (with
// the caller's device sections): RAM through Memory.WriteSparse, which
// skips unread the pages /proc/self/pagemap shows the host never mapped
// (zeros, or the holes of the image RAM was mapped from; sparse.go), so
// writing costs the RAM the guest touched, not the RAM it has.
package vmm
