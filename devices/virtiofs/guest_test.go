package virtiofs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

// More of the guest kernel's requests, for the test matrix (the wire
// structs after the header; see client_test.go for the client itself).

// Opcodes beyond client_test.go's.
const (
	opListxattr     = 23
	opRemovexattr   = 24
	opFsyncdir      = 30
	opGetlk         = 31
	opSetlk         = 32
	opAccess        = 34
	opDestroy       = 38
	opIoctl         = 39
	opPoll          = 40
	opNotifyReply   = 41
	opLseek         = 46
	opCopyFileRange = 47
	opSyncfs        = 50
	opTmpfile       = 51
)

type mknodIn struct{ Mode, Rdev, Umask, Padding uint32 }

type linkIn struct{ Oldnodeid uint64 }

type rename2In struct {
	Newdir         uint64
	Flags, Padding uint32
}

type getattrIn struct {
	Flags, Dummy uint32
	Fh           uint64
}

type fsyncIn struct {
	Fh                  uint64
	FsyncFlags, Padding uint32
}

type flushIn struct {
	Fh              uint64
	Unused, Padding uint32
	LockOwner       uint64
}

type interruptIn struct{ Unique uint64 }

type batchForgetIn struct{ Count, Dummy uint32 }

type forgetOne struct{ NodeId, Nlookup uint64 }

// entryOf decodes an EntryOut reply.
func entryOf(t testing.TB, rp reply) (fuse.EntryOut, syscall.Errno) {
	t.Helper()
	var e fuse.EntryOut
	if rp.errno == 0 {
		rp.ok(t, &e)
	}
	return e, rp.errno
}

func (r *rig) getattr(t testing.TB, node uint64) (fuse.AttrOut, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opGetattr, node, &getattrIn{})
	var a fuse.AttrOut
	if rp.errno == 0 {
		rp.ok(t, &a)
	}
	return a, rp.errno
}

func (r *rig) setattr(t testing.TB, node uint64, in setattrIn) (fuse.AttrOut, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opSetattr, node, &in)
	var a fuse.AttrOut
	if rp.errno == 0 {
		rp.ok(t, &a)
	}
	return a, rp.errno
}

func (r *rig) mkdir(t testing.TB, parent uint64, name string, mode uint32) (fuse.EntryOut, syscall.Errno) {
	t.Helper()
	return entryOf(t, r.call(t, opMkdir, parent, &mkdirIn{Mode: mode}, cstr(name)))
}

func (r *rig) mknod(t testing.TB, parent uint64, name string, mode, rdev uint32) (fuse.EntryOut, syscall.Errno) {
	t.Helper()
	return entryOf(t, r.call(t, opMknod, parent, &mknodIn{Mode: mode, Rdev: rdev}, cstr(name)))
}

func (r *rig) symlink(t testing.TB, parent uint64, name, target string) (fuse.EntryOut, syscall.Errno) {
	t.Helper()
	return entryOf(t, r.call(t, opSymlink, parent, nil, cstr(name), cstr(target)))
}

func (r *rig) link(t testing.TB, old, parent uint64, name string) (fuse.EntryOut, syscall.Errno) {
	t.Helper()
	return entryOf(t, r.call(t, opLink, parent, &linkIn{old}, cstr(name)))
}

func (r *rig) create(t testing.TB, parent uint64, name string, flags, mode uint32) (fuse.CreateOut, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opCreate, parent, &createIn{Flags: flags, Mode: mode}, cstr(name))
	var c fuse.CreateOut
	if rp.errno == 0 {
		rp.ok(t, &c)
	}
	return c, rp.errno
}

func (r *rig) unlink(t testing.TB, parent uint64, name string) syscall.Errno {
	t.Helper()
	return r.call(t, opUnlink, parent, nil, cstr(name)).errno
}

func (r *rig) rmdir(t testing.TB, parent uint64, name string) syscall.Errno {
	t.Helper()
	return r.call(t, opRmdir, parent, nil, cstr(name)).errno
}

func (r *rig) rename(t testing.TB, oldDir uint64, oldName string, newDir uint64, newName string) syscall.Errno {
	t.Helper()
	return r.call(t, opRename, oldDir, &renameIn{Newdir: newDir}, cstr(oldName), cstr(newName)).errno
}

func (r *rig) opendir(t testing.TB, node uint64) (fuse.OpenOut, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opOpendir, node, &openIn{})
	var o fuse.OpenOut
	if rp.errno == 0 {
		rp.ok(t, &o)
	}
	return o, rp.errno
}

func (r *rig) openOut(t testing.TB, node uint64, flags uint32) (fuse.OpenOut, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opOpen, node, &openIn{Flags: flags})
	var o fuse.OpenOut
	if rp.errno == 0 {
		rp.ok(t, &o)
	}
	return o, rp.errno
}

func (r *rig) fsync(t testing.TB, node, fh uint64, op uint32) syscall.Errno {
	t.Helper()
	return r.call(t, op, node, &fsyncIn{Fh: fh}).errno
}

func (r *rig) flush(t testing.TB, node, fh uint64) syscall.Errno {
	t.Helper()
	return r.call(t, opFlush, node, &flushIn{Fh: fh}).errno
}

func (r *rig) statfs(t testing.TB, node uint64) (fuse.StatfsOut, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opStatfs, node, nil)
	var s fuse.StatfsOut
	if rp.errno == 0 {
		rp.ok(t, &s)
	}
	return s, rp.errno
}

func (r *rig) readlink(t testing.TB, node uint64) (string, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opReadlink, node, nil)
	return string(rp.payload), rp.errno
}

// dirEntry is one entry of a READDIR or READDIRPLUS reply.
type dirEntry struct {
	name  string
	ino   uint64
	off   uint64
	typ   uint32        // S_IFMT bits
	entry fuse.EntryOut // READDIRPLUS only
}

// listDir reads a directory handle from offset 0 to the end with size-byte
// requests and returns every entry.
func (r *rig) listDir(t testing.TB, node, fh uint64, op uint32, size uint32) []dirEntry {
	t.Helper()
	var ents []dirEntry
	off := uint64(0)
	for range 100000 {
		rp := r.call(t, op, node, &readIn{Fh: fh, Offset: off, Size: size})
		require.Zero(t, rp.errno, "op %d at offset %d", op, off)
		if len(rp.payload) == 0 {
			return ents
		}
		require.LessOrEqual(t, len(rp.payload), int(size), "a listing fits the size asked for")
		b := rp.payload
		for len(b) > 0 {
			var d dirEntry
			if op == opReaddirplus {
				n := binary.Size(fuse.EntryOut{})
				require.GreaterOrEqual(t, len(b), n)
				reply{payload: b[:n]}.ok(t, &d.entry)
				b = b[n:]
			}
			require.GreaterOrEqual(t, len(b), 24)
			d.ino = binary.LittleEndian.Uint64(b)
			d.off = binary.LittleEndian.Uint64(b[8:])
			nameLen := int(binary.LittleEndian.Uint32(b[16:]))
			d.typ = binary.LittleEndian.Uint32(b[20:]) << 12
			require.GreaterOrEqual(t, len(b), 24+nameLen)
			d.name = string(b[24 : 24+nameLen])
			b = b[min(len(b), (24+nameLen+7)&^7):]
			ents = append(ents, d)
			off = d.off
		}
	}
	t.Fatal("the listing never ended")
	return nil
}

func names(ents []dirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.name)
	}
	return out
}

// snapshot describes every path under dir (type, permissions, size,
// modification time, content or link target), to check that an operation
// left the host as it was.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := os.Lstat(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		desc := fmt.Sprintf("%v %d %d", st.Mode(), st.Size(), st.ModTime().UnixNano())
		switch {
		case st.Mode().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			desc += " " + string(b)
		case st.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		if rel != "." || !st.IsDir() {
			out[rel] = desc
		}
		return nil
	}))
	return out
}

// errnoAt reads the error of a raw reply (0 for success).
func errnoAt(t testing.TB, data []byte) syscall.Errno {
	t.Helper()
	require.GreaterOrEqual(t, len(data), 16)
	return syscall.Errno(-int32(binary.LittleEndian.Uint32(data[4:])))
}

// uniqueOf returns the unique of a raw request (zero-padded when short).
func uniqueOf(msg []byte) uint64 {
	var h [16]byte
	copy(h[:], msg)
	return binary.LittleEndian.Uint64(h[8:])
}

// isErrorHeader says whether data is exactly an error reply to unique.
func isErrorHeader(data []byte, unique uint64, errno syscall.Errno) bool {
	if len(data) != 16 {
		return false
	}
	var want [16]byte
	binary.LittleEndian.PutUint32(want[0:], 16)
	binary.LittleEndian.PutUint32(want[4:], uint32(-int32(errno)))
	binary.LittleEndian.PutUint64(want[8:], unique)
	return bytes.Equal(data, want[:])
}
