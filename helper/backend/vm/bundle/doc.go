// Package bundle reads the desktop client's VM bundle, host side: the
// directory the client passes as bundlePath, its root image (RootImageName,
// a raw disk with a GPT or MBR partition table, or a bare ext4 filesystem)
// and the other disk images beside it. It owns the partition-table reader
// (table.go, gpt.go, mbr.go), the ext4 superblock reader (ext4.go), the
// choice of the root volume (root.go), and an image's cheap Identity
// (identity.go). It only reads: images are opened read-only and never
// written; serving a volume to the guest is the block layer's job
// (devices/blk), given the image, Volume.Offset and Volume.Length.
//
// The bundle is downloaded data and is read as untrusted input: every
// offset, size and count read from it is checked against the file's size
// and against this package's bounds (a GPT array of at most 1 MiB, at most
// 128 partitions in use, 256 directory entries looked at) before it is used
// or allocated for; a bad table or superblock is an error naming the file
// and what is wrong, never a panic. Fuzz targets cover the table and the
// superblock parsers.
//
// The root volume is the ext4 filesystem labelled RootLabel
// ("cloudimg-rootfs"), else the partition of type Linux root (x86-64),
// else the largest ext4 partition; Root.Reason says which rule chose it.
//
// To serve an image, open it with OpenImage, Inspect the open file (the
// same descriptor the block layer will read), and compare its Identity
// with the one the profile's writable layer was made over: Read's
// descriptors are closed, and the client may replace a file between two
// opens. Other images are the other regular files of the directory
// (symlinks followed); those that are not disk images are left out, those
// that are but cannot be used are in Bundle.Skipped with why (another disk
// format, qcow2 or VHDX, is named as such: only raw images are read).
//
// Sector size is 512 bytes. An MBR's extended partitions are not followed.
// "ext4" here means the ext2/3/4 family: one magic, one Linux driver.
package bundle
