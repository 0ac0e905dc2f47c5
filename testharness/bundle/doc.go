// Package bundle finds the stand-in VM bundle that tests boot in place of
// the desktop client's (issue #41): scripts/make-bundle.sh (make bundle,
// which .ci/run runs) builds it from Debian packages into the user's cache.
// It holds rootfs.img, a GPT disk laid out as the client's (partition 1
// ext4 "cloudimg-rootfs", 14 BIOS boot, 15 EFI system), and data.img, an
// ext4 image the root's /etc/fstab mounts by label. The names the image
// carries and the host lacks (a tool, a marker, a user) are constants here,
// so tests can tell the bundle's userland from the host's.
//
// It also reads such images with the system's tools, as an oracle
// independent of the product's parsers (Partitions: sfdisk), and makes
// a copy whose root filesystem has an unreplayed journal, as the official
// helper leaves it when killed (Bundle.DirtyJournalCopy: debugfs).
package bundle
