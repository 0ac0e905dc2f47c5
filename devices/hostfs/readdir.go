package hostfs

import (
	"io"
	"math"
	"sync"

	"golang.org/x/sys/unix"
)

// maxReaddirBytes caps one Readdir's reply whatever count the guest asks
// for (the virtio-9p device already clamps count to the negotiated msize).
const maxReaddirBytes = 1 << 20

// direntBufSize is the getdents64 buffer a Readdir reads the host
// directory with (pooled: at most one per request in flight).
const direntBufSize = 32 << 10

var direntBufs = sync.Pool{New: func() any { b := make([]byte, direntBufSize); return &b }}

// Readdir implements Node. Nothing is cached between calls: the offset
// is the host's own position in the directory (getdents64's d_off, the
// cookie lseek takes back; 0 is the start), so each call seeks the open
// directory there and reads on, as much as fits count bytes. A directory
// listing holds no memory between requests, however many Nodes list it.
func (f *file) Readdir(offset uint64, count uint32) ([]Dirent, error) {
	if err := f.ex.enter(); err != nil {
		return nil, err
	}
	defer f.ex.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openFd < 0 || !f.isDir() {
		return nil, unix.EBADF
	}
	count = min(count, maxReaddirBytes)
	if f.isViewRoot() {
		return f.viewDirents(offset, count)
	}
	return readDir(f.openFd, f.dev, offset, count)
}

// direntSize is what one entry takes in 9P's Rreaddir: qid[13] offset[8]
// type[1] name[s]. Readdir's count is in these bytes (virtio-fs divides
// the room of its reply to match).
func direntSize(name string) uint32 { return uint32(13 + 8 + 1 + 2 + len(name)) }

// fitDirents returns the entries from ents that fit count bytes.
func fitDirents(ents []Dirent, count uint32, used *uint32) ([]Dirent, bool) {
	for i, d := range ents {
		size := direntSize(d.Name)
		if *used+size > count {
			return ents[:i], false
		}
		*used += size
	}
	return ents, true
}

// readDir reads the directory open as fd from the host position offset
// with getdents64, as many entries as fit count bytes. Inode numbers are
// GuestIno's, with the directory's device.
func readDir(fd int, dev uint64, offset uint64, count uint32) ([]Dirent, error) {
	if offset > math.MaxInt64 {
		return nil, nil // no host position: the end
	}
	if _, err := unix.Seek(fd, int64(offset), io.SeekStart); err != nil {
		return nil, err
	}
	bp := direntBufs.Get().(*[]byte)
	defer direntBufs.Put(bp)
	var out []Dirent
	used := uint32(0)
	for {
		n, err := unix.Getdents(fd, *bp)
		if err != nil {
			if len(out) > 0 {
				return out, nil // the next call meets the error again
			}
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		ents, err := parseDirents((*bp)[:n], dev)
		if err != nil {
			return nil, err
		}
		fit, all := fitDirents(ents, count, &used)
		out = append(out, fit...)
		if !all {
			return out, nil
		}
	}
}

// parseDirents decodes a getdents64 buffer: ino[8] off[8] reclen[2]
// type[1] name (NUL-terminated, padded).
func parseDirents(b []byte, dev uint64) ([]Dirent, error) {
	var ents []Dirent
	for len(b) >= 19 {
		ino, off := leUint64(b[0:8]), leUint64(b[8:16])
		reclen := int(uint16(b[16]) | uint16(b[17])<<8)
		if reclen < 19 || reclen > len(b) {
			return nil, unix.EIO
		}
		typ := b[18]
		nameBytes := b[19:reclen]
		for i, c := range nameBytes {
			if c == 0 {
				nameBytes = nameBytes[:i]
				break
			}
		}
		b = b[reclen:]
		ents = append(ents, Dirent{Ino: GuestIno(dev, ino), Offset: off, Type: direntType(typ), Name: string(nameBytes)})
	}
	return ents, nil
}

// viewDirents lists a single-file export's directory: ".", ".." and the
// one name while it names a regular file (an immutable export's always:
// its pinned file), at offsets 1, 2, 3.
func (f *file) viewDirents(offset uint64, count uint32) ([]Dirent, error) {
	st, err := fstat(f.fd)
	if err != nil {
		return nil, err
	}
	dir := GuestIno(st.Dev, st.Ino)
	ents := []Dirent{
		{Ino: dir, Offset: 1, Type: unix.DT_DIR, Name: "."},
		{Ino: dir, Offset: 2, Type: unix.DT_DIR, Name: ".."},
	}
	if fd, fst, err := f.ex.viewFile(f.fd); err == nil {
		_ = unix.Close(fd)
		ents = append(ents, Dirent{Ino: GuestIno(fst.Dev, fst.Ino), Offset: 3, Type: unix.DT_REG, Name: f.ex.viewName})
	}
	if offset >= uint64(len(ents)) {
		return nil, nil
	}
	used := uint32(0)
	fit, _ := fitDirents(ents[offset:], count, &used)
	return fit, nil
}

func leUint64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// direntType is a host entry's type as Dirent reports it: directories
// and symlinks as such, anything else as a regular file (the guest learns
// a FIFO's or socket's type from its attributes).
func direntType(t byte) uint8 {
	switch t {
	case unix.DT_DIR, unix.DT_LNK:
		return t
	}
	return unix.DT_REG
}
