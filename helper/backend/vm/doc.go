// Package vm is the helper's VM backend, "kvm" by name
// (COWORK_VMM_BACKEND): each guest is a micro-VM on our own VMM (package
// machine, over vmm/kvm) booting the cowork-vmm guest kernel with an
// initramfs made at start from the helper's own executable, so the agent
// that runs as the guest's /init is always the helper's own build.
//
// It owns what makes a machine a Cowork guest: finding the kernel (override,
// embedded, beside the executable, the build cache), building the
// initramfs, sizing (defaults and host limits), the devices (virtio-vsock
// with the guest at CID 3; two file-sharing devices, virtio-fs or with
// COWORK_VMM_FS=9p virtio-9p, whose attach names are the exports Share
// registers (uncached in the guest) and the read-only system directories
// and immutable files (the SDK binary) ShareSystem registers (page-cached
// in the guest); virtio-rng; the profile's root disk, or when the client's
// bundle can be booted its images through copy-on-write layers, see
// bundleboot.go), the
// agent's vsock connection, boot progress steps, the serial console (debug
// log plus a tail kept for error messages), and turning the VM's end into
// Done/Err, and the VM's snapshots: the first-boot snapshot restored for a
// warm start (snapshot.go) and a profile's guest suspended at stopVM and
// resumed by its next start (suspend.go). It refuses fast, with the
// process-backend hint, on hosts whose
// KVM cannot boot Linux (PVM) or that have no usable /dev/kvm, and on a
// COWORK_VMM_FS it does not know.
package vm
