// Package initramfs writes Linux initramfs images: newc-format cpio archives,
// optionally gzip-compressed, built from an in-memory list of files.
//
// It is used by the nested test harness for its outer guest and by the VM
// backend to pack the helper's own executable as the guest's /init. It only
// writes archives; it never parses one. Parent directories are created
// implicitly, entries are written in a deterministic order with zero
// timestamps and root ownership, so the same input gives the same bytes.
package initramfs
