// Package kernel locates the Linux kernels that guest/kernel/build.sh builds
// and caches outside the clone: the "guest" flavour our VMM boots and the
// "outer" flavour the nested test harness runs under qemu, each for x86-64
// and for arm64 ("guest-arm64", "outer-arm64").
//
// The build script, the config fragments and this finder live together so
// the cache layout has one owner: $KERNEL_CACHE/<flavour>-<hash>/ holds
// {vmlinux,bzImage,config} (x86-64) or {Image,vmlinux,config} (arm64), and
// the symlink $KERNEL_CACHE/<flavour>-current names the latest build. Find
// gives the file a VMM boots (vmlinux; Image on arm64); GuestFor and
// FindGuest pick the guest flavour for a GOARCH.
//
// # Fragments
//
// Every flavour starts from tinyconfig. guest.fragment is the one list of
// what a guest needs (virtio, vsock, 9p, virtio-fs, ext4, overlay,
// namespaces, seccomp, cgroups, ...); guest-only.fragment adds the guest
// kernel's boot-time cuts and outer-kvm.fragment the harness kernel's KVM,
// TUN, VETH, THP and debugfs. The arm64 flavours add arm64.fragment, which
// names only what differs on arm64: guest.fragment's x86-only options as
// "# allow-drop:", no PCI (every device comes from the device tree or
// virtio_mmio.device=), GICv3, the architected timer, PSCI, 4 KiB pages,
// HZ 250, no KASLR (from guest-only.fragment) and two consoles, the device
// tree's 16550 on MMIO (our VMM) and the PL011 (qemu -M virt's ttyAMA0).
// guest-only-arm64.fragment adds /dev/mem, through which the agent writes
// the boot timer and snapshot point MMIO pages: by mmap, with plain loads
// and stores (no pairs, no writeback: KVM decodes only those), since arm64's
// /dev/mem read and write reach RAM only (EFAULT on MMIO; checked under
// qemu on its PL031 page at 0x0901_0000); outer-kvm-arm64.fragment
// lets outer-kvm.fragment's AMD options drop: qemu -M virt,virtualization=on
// boots the outer kernel at EL2, where KVM runs in VHE mode.
//
// The arm64 kernels are cross-built with gcc-aarch64-linux-gnu (natively on
// an arm64 host): `make kernel-arm64`, `make kernel-outer-arm64`. Measured
// on 2 busy cores: 7-26 min a build; Image 6.3 MiB (guest) and 6.6 MiB
// (outer), 2.7 MiB gzip-embedded. Under qemu-system-aarch64 TCG (-M virt
// -cpu max) both reach /init in 0.5-1.8 s of kernel time (idle to busy
// host); the outer
// one at EL2 logs "VHE mode initialized successfully" and has /dev/kvm.
package kernel
