package virtiofs

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/hostfs/hostfstest"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// The test client plays the guest kernel's FUSE driver: it encodes
// requests with go-fuse's wire structs, sends each in one chain on the
// request queue (FORGET on the high-priority queue) and decodes the reply.

// FUSE opcodes the client sends (the kernel's values).
const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opSetattr     = 4
	opReadlink    = 5
	opSymlink     = 6
	opMknod       = 8
	opMkdir       = 9
	opUnlink      = 10
	opRmdir       = 11
	opRename      = 12
	opLink        = 13
	opOpen        = 14
	opRead        = 15
	opWrite       = 16
	opStatfs      = 17
	opRelease     = 18
	opFsync       = 20
	opSetxattr    = 21
	opGetxattr    = 22
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opCreate      = 35
	opInterrupt   = 36
	opBatchForget = 42
	opFallocate   = 43
	opReaddirplus = 44
	opRename2     = 45
)

const waitLimit = 20 * time.Second

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// rig is a device behind the test driver, over exports in a temp dir.
type rig struct {
	dir     string
	exports *hostfs.Exports
	dev     *Device
	drv     *virtiotest.Driver
	unique  atomic.Uint64
}

func newRig(t testing.TB, opts Options) *rig {
	t.Helper()
	return newRigOver(t, opts, hostfs.NewExports(discardLogger()))
}

// newRigOver is newRig over exports of the caller's (a budget of its own).
func newRigOver(t testing.TB, opts Options, exports *hostfs.Exports) *rig {
	t.Helper()
	r := &rig{dir: t.TempDir(), exports: exports}
	if opts.Tag == "" {
		opts.Tag = "cowork"
	}
	opts.Root = r.exports
	if opts.Logger == nil {
		opts.Logger = discardLogger()
	}
	dev, err := New(opts)
	require.NoError(t, err)
	r.dev = dev
	r.drv = virtiotest.Start(t, dev, virtiotest.Options{MemSize: 64 << 20})
	t.Cleanup(func() {
		dev.Close()
		r.exports.Close()
	})
	return r
}

// export adds a directory export holding files (path → content).
func (r *rig) export(t testing.TB, name string, readOnly bool, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(r.dir, name)
	hostfstest.WriteTree(t, dir, files)
	require.NoError(t, r.exports.Add(name, dir, readOnly))
	return dir
}

// encode builds a request: the header (length filled in), args (a wire
// struct, or nil) and trailing bytes (names, data).
func (r *rig) encode(op uint32, node uint64, args any, tail ...[]byte) ([]byte, uint64) {
	var body bytes.Buffer
	if args != nil {
		if err := binary.Write(&body, binary.LittleEndian, args); err != nil {
			panic(err)
		}
	}
	for _, b := range tail {
		body.Write(b)
	}
	unique := r.unique.Add(1)
	h := fuse.InHeader{Opcode: op, Unique: unique, NodeId: node}
	h.Length = uint32(binary.Size(h) + body.Len())
	var msg bytes.Buffer
	_ = binary.Write(&msg, binary.LittleEndian, h)
	msg.Write(body.Bytes())
	return msg.Bytes(), unique
}

// reply is a decoded reply: the errno (0 = success) and the payload.
type reply struct {
	errno   syscall.Errno
	payload []byte
	used    uint32
}

// send sends one raw request on queue q with room for writable reply
// bytes and waits for its completion.
func (r *rig) send(t testing.TB, q int, msg []byte, writable uint32) virtiotest.Used {
	t.Helper()
	dq := r.drv.Queue(q)
	bufs := []virtiotest.Buffer{virtiotest.Readable(msg)}
	if writable > 0 {
		bufs = append(bufs, virtiotest.Writable(writable))
	}
	_, err := dq.Add(bufs...)
	require.NoError(t, err)
	dq.Kick()
	u, err := dq.Wait(waitLimit)
	require.NoError(t, err)
	return u
}

// call sends a request on the request queue and decodes its reply,
// checking the header's length and unique.
func (r *rig) call(t testing.TB, op uint32, node uint64, args any, tail ...[]byte) reply {
	t.Helper()
	msg, unique := r.encode(op, node, args, tail...)
	u := r.send(t, requestQueue, msg, maxMessage)
	require.GreaterOrEqual(t, len(u.Data), 16, "reply to op %d", op)
	var h fuse.OutHeader
	require.NoError(t, binary.Read(bytes.NewReader(u.Data), binary.LittleEndian, &h))
	require.Equal(t, unique, h.Unique, "reply unique")
	require.Equal(t, u.Len, h.Length, "reply length")
	return reply{errno: syscall.Errno(-h.Status), payload: u.Data[16:h.Length], used: u.Len}
}

// ok fails the test unless the reply succeeded, and decodes its payload
// into out (when not nil).
func (rp reply) ok(t testing.TB, out any) {
	t.Helper()
	require.Zero(t, rp.errno, "errno %v", rp.errno)
	if out == nil {
		return
	}
	// The wire structs have unexported padding fields, which
	// encoding/binary refuses: copy the bytes over the struct (the
	// test host is little-endian, as the protocol is).
	v := reflect.ValueOf(out).Elem()
	size := int(v.Type().Size())
	require.GreaterOrEqual(t, len(rp.payload), size, "payload of %T", out)
	copy(unsafe.Slice((*byte)(v.Addr().UnsafePointer()), size), rp.payload)
}

func cstr(s string) []byte { return append([]byte(s), 0) }

// initSession sends FUSE_INIT as Linux 6.1 does.
func (r *rig) initSession(t testing.TB) fuse.InitOut {
	t.Helper()
	in := struct {
		Major, Minor, MaxReadAhead, Flags, Flags2 uint32
		Unused                                    [11]uint32
	}{Major: 7, Minor: 36, MaxReadAhead: 128 << 10,
		Flags: uint32(fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_READDIRPLUS | fuse.CAP_MAX_PAGES | fuse.CAP_PARALLEL_DIROPS | fuse.CAP_AUTO_INVAL_DATA | fuse.CAP_CACHE_SYMLINKS)}
	var out fuse.InitOut
	r.call(t, opInit, 0, &in).ok(t, &out)
	return out
}

func (r *rig) lookup(t testing.TB, parent uint64, name string) (fuse.EntryOut, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opLookup, parent, nil, cstr(name))
	var e fuse.EntryOut
	if rp.errno == 0 {
		rp.ok(t, &e)
	}
	return e, rp.errno
}

// walk looks up each name from the root and returns the last node id.
func (r *rig) walk(t testing.TB, names ...string) uint64 {
	t.Helper()
	node := uint64(fuse.FUSE_ROOT_ID)
	for _, n := range names {
		e, errno := r.lookup(t, node, n)
		require.Zero(t, errno, "lookup %q", n)
		node = e.NodeId
	}
	return node
}

type openIn struct{ Flags, OpenFlags uint32 }

func (r *rig) open(t testing.TB, node uint64, flags uint32) (uint64, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opOpen, node, &openIn{Flags: flags})
	if rp.errno != 0 {
		return 0, rp.errno
	}
	var o fuse.OpenOut
	rp.ok(t, &o)
	return o.Fh, 0
}

type readIn struct {
	Fh        uint64
	Offset    uint64
	Size      uint32
	ReadFlags uint32
	LockOwner uint64
	Flags     uint32
	Padding   uint32
}

func (r *rig) read(t testing.TB, node, fh, off uint64, size uint32) ([]byte, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opRead, node, &readIn{Fh: fh, Offset: off, Size: size})
	return rp.payload, rp.errno
}

type writeIn struct {
	Fh         uint64
	Offset     uint64
	Size       uint32
	WriteFlags uint32
	LockOwner  uint64
	Flags      uint32
	Padding    uint32
}

func (r *rig) write(t testing.TB, node, fh, off uint64, data []byte) (uint32, syscall.Errno) {
	t.Helper()
	rp := r.call(t, opWrite, node, &writeIn{Fh: fh, Offset: off, Size: uint32(len(data))}, data)
	if rp.errno != 0 {
		return 0, rp.errno
	}
	var o fuse.WriteOut
	rp.ok(t, &o)
	return o.Size, 0
}

type releaseIn struct {
	Fh           uint64
	Flags        uint32
	ReleaseFlags uint32
	LockOwner    uint64
}

func (r *rig) release(t testing.TB, node, fh uint64, op uint32) {
	t.Helper()
	msg, _ := r.encode(op, node, &releaseIn{Fh: fh})
	r.send(t, requestQueue, msg, maxMessage)
}

// forget sends FORGET on the high-priority queue (no reply).
func (r *rig) forget(t testing.TB, node, n uint64) {
	t.Helper()
	msg, _ := r.encode(opForget, node, &struct{ N uint64 }{n})
	u := r.send(t, hiprioQueue, msg, 0)
	require.Zero(t, u.Len)
}

// readdir lists a directory handle with READDIR from offset 0 to the end,
// returning the names.
func (r *rig) readdir(t testing.TB, node, fh uint64, op uint32) []string {
	t.Helper()
	var names []string
	off := uint64(0)
	for range 10000 {
		rp := r.call(t, op, node, &readIn{Fh: fh, Offset: off, Size: 4096})
		rp.ok(t, nil)
		if len(rp.payload) == 0 {
			return names
		}
		b := rp.payload
		for len(b) > 0 {
			if op == opReaddirplus {
				b = b[binary.Size(fuse.EntryOut{}):]
			}
			// dirent: ino[8] off[8] namelen[4] type[4] name, padded to 8
			off = binary.LittleEndian.Uint64(b[8:])
			nameLen := int(binary.LittleEndian.Uint32(b[16:]))
			names = append(names, string(b[24:24+nameLen]))
			b = b[(24+nameLen+7)&^7:]
		}
	}
	t.Fatal("readdir never ended")
	return nil
}

var (
	virtiotestReadable = virtiotest.Readable
	virtiotestWritable = virtiotest.Writable
)
