package blk

// Backing is the storage a Device serves: a disk of Size bytes. File is
// the raw image file; package cow layers a copy-on-write overlay over a
// read-only base.
//
// The device checks every range before it calls a backing: off and size
// are whole sectors and [off, off+size) lies inside [0, Size()). It calls
// the methods from one goroutine at a time (its worker), so a backing
// need not serialize them against each other; one that has other callers
// (a Close from the owner) locks for itself.
type Backing interface {
	// Name is the backing's name in logs (usually a file name).
	Name() string
	// Size is the disk's size in bytes: a positive multiple of
	// SectorSize, fixed for the backing's life.
	Size() int64
	// ReadV fills all of iov, the request's data buffers in guest memory,
	// from off. It returns how many bytes it filled before any error.
	// It may change iov's slice headers, never what they point to.
	ReadV(iov [][]byte, off int64) (int, error)
	// WriteV writes all of iov at off. It may change iov's slice headers.
	WriteV(iov [][]byte, off int64) error
	// Flush makes every completed write stable (VIRTIO_BLK_T_FLUSH).
	Flush() error
	// Discard tells the backing [off, off+size) is unused. It is
	// advisory: afterwards the range reads as zeros or as it did before.
	Discard(off, size int64) error
	// WriteZeroes makes [off, off+size) read as zeros; unmap allows the
	// backing to deallocate the range instead of writing zeros.
	WriteZeroes(off, size int64, unmap bool) error
}
