// Package kernel locates the Linux kernels that guest/kernel/build.sh builds
// and caches outside the clone: the "guest" flavour our VMM boots and the
// "outer" flavour the nested test harness runs under qemu.
//
// The build script, the config fragments (guest.fragment, guest-only.fragment, outer-kvm.fragment)
// and this finder live together so the cache layout has one owner:
// $KERNEL_CACHE/<flavour>-<hash>/{vmlinux,bzImage,config} with the symlink
// $KERNEL_CACHE/<flavour>-current naming the latest build.
package kernel
