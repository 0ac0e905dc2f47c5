package virtiofs

import (
	"bytes"
	"encoding/binary"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

func le(v any) []byte {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, v)
	return b.Bytes()
}

// FuzzRequest feeds arbitrary FUSE requests (an opcode, a node id, the
// bytes after the header, whether the header's length is true, how much
// reply room and whether the request is split across two buffers) to a
// live device over a real read-write export, after a valid FUSE_INIT.
// Invariants: every chain is answered (no hang, no panic); a reply is
// either empty or a header whose length is the used length and whose
// unique is the request's; the node and handle tables stay bounded.
func FuzzRequest(f *testing.F) {
	seeds := []struct {
		op   uint32
		node uint64
		body []byte
	}{
		{opLookup, fuse.FUSE_ROOT_ID, cstr("e1")},
		{opLookup, 2, cstr("f")},
		{opLookup, 2, cstr("..")},
		{opGetattr, 2, make([]byte, 16)},
		{opOpen, 3, le(&openIn{Flags: syscall.O_RDWR})},
		{opRead, 3, le(&readIn{Fh: 1, Size: 100})},
		{opWrite, 3, append(le(&writeIn{Fh: 1, Size: 3}), "abc"...)},
		{opCreate, 2, append(le(&createIn{Flags: syscall.O_WRONLY, Mode: 0o644}), cstr("n")...)},
		{opMkdir, 2, append(le(&mkdirIn{Mode: 0o755}), cstr("d")...)},
		{opRename, 2, append(le(&renameIn{Newdir: 2}), append(cstr("n"), cstr("m")...)...)},
		{opRename2, 2, append(le(&struct {
			Newdir     uint64
			Flags, Pad uint32
		}{2, 1, 0}), append(cstr("m"), cstr("n")...)...)},
		{opUnlink, 2, cstr("m")},
		{opSetattr, 3, le(&setattrIn{Valid: fuse.FATTR_MODE | fuse.FATTR_SIZE, Mode: 0o4777, Size: 1})},
		{opOpendir, 2, le(&openIn{})},
		{opReaddirplus, 2, le(&readIn{Fh: 2, Size: 4096})},
		{opStatfs, 2, nil},
		{opFsync, 3, le(&struct {
			Fh         uint64
			Flags, Pad uint32
		}{1, 0, 0})},
		{opFlush, 3, le(&struct {
			Fh          uint64
			Unused, Pad uint32
			Owner       uint64
		}{Fh: 1})},
		{opForget, 3, le(&struct{ N uint64 }{1})},
		{opBatchForget, 0, append(le(&struct{ Count, Dummy uint32 }{2, 0}), le(&[4]uint64{3, 1, 4, 1 << 62})...)},
		{opGetxattr, 3, append(le(&struct{ Size, Pad uint32 }{64, 0}), cstr("security.capability")...)},
		{opFallocate, 3, make([]byte, 32)},
		{opInit, 0, le(&struct{ Major, Minor, Ra, Flags uint32 }{7, 36, 0, 0})},
		{opSymlink, 2, append(cstr("s"), cstr("/etc/passwd")...)},
		{opLink, 2, append(le(&struct{ Old uint64 }{3}), cstr("l")...)},
	}
	for _, s := range seeds {
		f.Add(s.op, s.node, s.body, true, uint16(4096), false)
	}
	f.Add(uint32(opWrite), uint64(3), []byte{1, 2, 3}, false, uint16(16), true)
	f.Add(uint32(0), uint64(0), []byte{}, true, uint16(0), false)

	r := newRig(f, Options{MaxNodes: 64, MaxHandles: 16})
	r.export(f, "e1", false, map[string]string{"f": "content", "d/g": "more"})
	r.initSession(f)

	f.Fuzz(func(t *testing.T, op uint32, node uint64, body []byte, trueLength bool, writable uint16, split bool) {
		if len(body) > 64<<10 {
			return
		}
		msg, unique := r.encode(op, node, nil, body)
		if !trueLength {
			binary.LittleEndian.PutUint32(msg, uint32(len(body))*7)
		}
		bufs := []virtiotest.Buffer{virtiotest.Readable(msg)}
		if split && len(msg) > 1 {
			bufs = []virtiotest.Buffer{virtiotest.Readable(msg[:len(msg)/2]), virtiotest.Readable(msg[len(msg)/2:])}
		}
		if writable > 0 {
			bufs = append(bufs, virtiotest.Writable(uint32(writable)))
		}
		q := r.drv.Queue(requestQueue)
		if op == opForget || op == opBatchForget || op == opInterrupt {
			q = r.drv.Queue(hiprioQueue)
		}
		if _, err := q.Add(bufs...); err != nil {
			t.Fatal(err)
		}
		q.Kick()
		u, err := q.Wait(waitLimit)
		if err != nil {
			t.Fatalf("op %d: no answer: %v", op, err)
		}
		if u.Len > uint32(writable) {
			t.Fatalf("op %d: used %d > writable %d", op, u.Len, writable)
		}
		if u.Len > 0 {
			if u.Len < 16 {
				t.Fatalf("op %d: a %d-byte reply", op, u.Len)
			}
			if got := binary.LittleEndian.Uint32(u.Data); got != u.Len {
				t.Fatalf("op %d: header length %d, used %d", op, got, u.Len)
			}
			if got := binary.LittleEndian.Uint64(u.Data[8:]); got != unique && len(msg) >= 16 {
				t.Fatalf("op %d: unique %d, want %d", op, got, unique)
			}
		}
		if nodes, handles := r.dev.Counts(); nodes > 64 || handles > 16 {
			t.Fatalf("tables grew past their bounds: %d nodes, %d handles", nodes, handles)
		}
	})
}
