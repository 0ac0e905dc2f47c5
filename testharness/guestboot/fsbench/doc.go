// Package fsbench is the contract between testinit's file-system benchmark
// mode and the host side that boots it (package guestboot): the kernel
// command line words that switch the mode on and say what to mount and
// measure, the layout of the shared directory, the workloads and the
// figures they report, and the console lines the guest reports with. It
// has no dependencies beyond the standard library so that testinit, a tiny
// /init, stays small.
//
// The workloads, in the order the guest runs them:
//
//   - seq: a file of MiB blocks of BlockSize written (one write() each),
//     fsync'd and closed, the guest's page cache dropped, then read back
//     through a fresh descriptor (one read() a block) and checked;
//   - rand: the page cache dropped, then RandReads 4 KiB reads at random
//     4 KiB-aligned offsets of that file (fixed seed), each checked;
//   - walk: the page cache dropped, then the tree the host made (Dirs
//     directories of FilesPerDir files) walked the way `git status` walks
//     a work tree: every directory read, every entry lstat'ed, once cold
//     and once warm;
//   - git: `git status` in that tree (a repository the host committed),
//     run chrooted in the host's root (the root mount), cold and warm;
//   - python: `python3 -c 'import json'` chrooted in the host's root,
//     cold (page cache dropped) and warm (median of three).
//
// Each workload prints one Result line; the last line is EndMarker. Around
// the timed part of each metric the guest prints a MarkLine (begin, end),
// and first an empty pair (MarkEmpty, the marks' own cost), so that the
// host can count what the VMM did for each metric (KVM exits, its CPU
// time: package bench's work accounting).
//
// The data device may also be a raw virtio-blk disk (TypeBlock): then seq
// and rand run on the device itself (/dev/vda), with no file system, and
// the seq "file" is the whole disk.
package fsbench
