// Package snapshot is the on-disk format of a VM snapshot: a fixed
// preamble (magic, format version, header length), a JSON header naming
// what the snapshot was taken of (Identity: the helper's build, the guest
// kernel, memory size, vCPUs) and where each section lies, then the
// sections (the vCPU and VM state, each device's state, guest memory),
// each starting on a 64 KiB boundary so guest memory can be mapped from
// the file on hosts of 4, 16 and 64 KiB pages, and a CRC-32C as the last
// four bytes. Guest RAM the guest never touched is stored as holes, and
// the checksum covers only the 4 KiB blocks that hold data (sparse.go),
// so writing and checking a snapshot cost what the guest used, not what
// it was given. A section's data that knows some of its zero blocks
// (SparseSource, as guest RAM does) has them skipped without being read.
//
// Open refuses, with an error saying why, a file of another format
// version, taken of another identity, cut short, or whose checksum does
// not match: the caller then boots cold. What the sections hold is the
// caller's (package vmm's State, the devices' own encodings); this package
// only stores and finds them.
package snapshot
