// Package readahead sets the read-ahead window the guest kernel uses for a
// mounted file system: its backing device's read_ahead_kb in sysfs.
//
// Why: FUSE (virtio-fs) caps its read-ahead at the kernel's default of
// 128 KiB whatever max_readahead the device offers, so a sequential read
// of a shared file goes out in 128 KiB requests, eight times as many
// round trips as the device's largest read (1 MiB) needs. Over a virtio
// queue each round trip is a notify, an interrupt and the guest's wake-up,
// so the window decides sequential read speed.
package readahead
