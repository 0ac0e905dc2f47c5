// Package loader puts a Linux kernel, its initrd and its command line into
// guest memory: an uncompressed ELF vmlinux (64-bit Linux boot protocol
// entry, and the PVH entry from its Xen ELF note) or a bzImage (setup header
// and protected-mode kernel, 64-bit entry). PrepareBoot does the whole boot
// set-up with the vmm/x86 builders and returns the boot vCPU's registers.
//
// Images are untrusted input: every header field is checked before use and
// a malformed image is rejected with an error saying what is wrong, never a
// panic.
package loader
