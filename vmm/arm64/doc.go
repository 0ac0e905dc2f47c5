// Package arm64 is the arm64 platform of a Linux guest, as plain data: the
// guest physical layout (RAM at 2 GiB, the GICv3 or GICv2, the 16550
// console, the virtio-mmio window, our boot timer and snapshot point
// pages), the flattened device tree describing it (DeviceTree, over a
// small DTB writer), and the arm64 Linux Image boot protocol
// (ParseImageHeader, PrepareBoot: kernel, initrd and DTB in RAM, and the
// boot vCPU's PC, X0 and PSTATE).
//
// It performs no ioctls: creating the vGIC, the vCPUs (PSCI 0.2, secondary
// vCPUs powered off) and setting their registers are vmm/kvm's and the VM's
// (package vmm) business. Everything that writes guest memory goes through
// GuestWriter, so all of it is tested without /dev/kvm. Kernel images are
// untrusted input: a malformed one gets an error, never a panic.
package arm64
