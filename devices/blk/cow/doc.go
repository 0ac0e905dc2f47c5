// Package cow is a block-level copy-on-write disk: a blk.Backing that
// serves a read-only base (a region of a host file, such as the root
// partition inside the desktop client's VM bundle image) with the guest's
// writes kept in a sparse per-profile overlay file. The base is opened
// O_RDONLY by the caller and only ever read: Open refuses a base
// descriptor that could write.
//
// The disk is cut into clusters of ClusterSize (64 KiB; the last one may
// be shorter). Each is in one of three states, two bits in the map:
//
//   - Base: reads the base's bytes; nothing in the overlay.
//   - Present: reads the overlay's copy, which holds the whole cluster.
//   - Zero: reads as zeros; nothing in the overlay (discarded, or zeroed
//     by write-zeroes; see zero.go).
//
// A write to a Present cluster, or one covering a cluster whole, goes
// straight from guest memory to the overlay (pwritev); a partial write to
// a Base or Zero cluster first copies it up (its bytes, merged with the
// write, written whole), so a Present cluster never mixes sources.
//
// # The overlay file
//
// One file, little-endian, laid out from the base's size (never from its
// own contents):
//
//	[0, S)      map slot 0   S = the slot size: header and bitmap,
//	[S, 2S)     map slot 1       rounded up to 4 KiB
//	[D, D+len)  data         D = 2S rounded up to ClusterSize; the
//	                             base's byte b is kept at D+b, sparse
//
// A slot is a 320-byte header then the bitmap (2 bits a cluster, four a
// byte, low bits first; bits past the last cluster zero):
//
//	0   magic "COWVMMOV"       40  identity length (u32, ≤ 256)
//	8   version (u32, 1)       44  CRC-32C of the header (this field 0)
//	12  cluster size (u32)     48  CRC-32C of the bitmap
//	16  generation (u64, ≥1)   52  reserved, zero
//	24  base size (u64)        64  identity (256 bytes, zero-padded)
//	32  clusters (u64)
//
// The identity is the caller's name for the base's content; a slot whose
// header is intact but names another base size or identity is refused
// with ErrMismatch, so an overlay is never served over an image it was
// not made for. MaxBaseSize (1 TiB) bounds the map at 4 MiB a slot.
//
// # Crash safety
//
// Flush (VIRTIO_BLK_T_FLUSH, and each write when the driver has no FLUSH)
// and Close commit: (1) fdatasync the overlay, which makes every copy-up
// and write so far durable; (2) if the map changed, write it as
// generation g+1 into slot (g+1)%2, the one the last commit did not use;
// (3) fdatasync again; only then is g+1 the committed generation. Open
// takes the valid slot of the highest generation.
//
// Hence a committed map never names a cluster Present whose copy is not
// durable: a cluster becomes Present in memory only after its whole copy
// was written, and reaches a slot only after step (1) synced that copy.
// A crash before (3) completes leaves the torn slot invalid by its
// checksums and the other slot, generation g, whole: the map of the last
// commit, every copy it names synced by that commit's step (1). So after
// a crash at any point each cluster reads its bytes as of the last
// completed flush, or bytes the guest wrote, zeroed or discarded since
// (an overwrite of a Present cluster is in place, as on any disk with a
// write cache); never another cluster's bytes or unwritten space. A
// cluster is never reused for another place: the data region mirrors the
// base, so there is no allocation to get wrong.
//
// An empty overlay is laid out afresh with generation 1 in slot 1. One
// of the overlay's full size whose slot 0 is zeros and slot 1 zeros or a
// torn first commit (it begins with the magic) never committed anything
// and is laid out afresh too; any other file without a valid slot is
// refused, never reset, and so is an overlay that is the base's own file.
package cow
