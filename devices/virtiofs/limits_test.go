package virtiofs

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// Bounds and the requests a hostile guest gets wrong on purpose.

// Full tables answer ENFILE, never grow, and have room again once the
// guest forgets or releases.
func TestFullTablesAnswerENFILEAndRecover(t *testing.T) {
	r := newRig(t, Options{MaxNodes: 5, MaxHandles: 2})
	files := map[string]string{}
	for i := range 6 {
		files["d/f"+itoa(i)] = "x"
	}
	r.export(t, "e1", false, files)
	r.initSession(t)
	d := r.walk(t, "e1", "d") // root, e1, d
	f0, errno := r.lookup(t, d, "f000")
	require.Zero(t, errno)
	f1, errno := r.lookup(t, d, "f001")
	require.Zero(t, errno)
	_, errno = r.lookup(t, d, "f002")
	require.Equal(t, syscall.ENFILE, errno, "LOOKUP beyond MaxNodes")
	again, errno := r.lookup(t, d, "f000")
	require.Zero(t, errno, "a node the guest holds is found without room")
	require.Equal(t, f0.NodeId, again.NodeId)
	_, errno = r.mkdir(t, d, "newdir", 0o755)
	require.Equal(t, syscall.ENFILE, errno, "MKDIR's entry needs a node too")

	// READDIRPLUS lists every entry; those without room go without a node.
	o, errno := r.opendir(t, d)
	require.Zero(t, errno)
	ents := r.listDir(t, d, o.Fh, opReaddirplus, 4096)
	require.Len(t, ents, 2+6+1, ". .. six files and newdir")
	for _, e := range ents {
		switch e.name {
		case "f000":
			require.Equal(t, f0.NodeId, e.entry.NodeId)
		case "f001":
			require.Equal(t, f1.NodeId, e.entry.NodeId)
		default:
			require.Zero(t, e.entry.NodeId, "%s: no room for its node", e.name)
		}
	}
	nodes, _ := r.dev.Counts()
	require.Equal(t, 5, nodes)

	fh, errno := r.open(t, f0.NodeId, syscall.O_RDONLY)
	require.Zero(t, errno)
	_, errno = r.open(t, f1.NodeId, syscall.O_RDONLY)
	require.Equal(t, syscall.ENFILE, errno, "OPEN beyond MaxHandles")
	_, errno = r.opendir(t, d)
	require.Equal(t, syscall.ENFILE, errno, "OPENDIR beyond MaxHandles")
	_, errno = r.create(t, d, "created", syscall.O_RDWR, 0o644)
	require.Equal(t, syscall.ENFILE, errno, "CREATE beyond MaxHandles")
	_, handles := r.dev.Counts()
	require.Equal(t, 2, handles)

	r.forget(t, f1.NodeId, 1)
	_, errno = r.lookup(t, d, "f002")
	require.Equal(t, syscall.ENFILE, errno, "READDIRPLUS counted a second lookup of f001")
	r.forget(t, f1.NodeId, 1)
	_, errno = r.lookup(t, d, "f002")
	require.Zero(t, errno, "room again after a FORGET")
	r.release(t, f0.NodeId, fh, opRelease)
	_, errno = r.open(t, f0.NodeId, syscall.O_RDONLY)
	require.Zero(t, errno, "room again after a RELEASE")
}

// FORGET of unknown ids, of the root, of more than was looked up, twice, and
// BATCH_FORGET claiming more entries than it carries: absorbed, never a
// crash, and node ids are never reused.
func TestForgetsTheGuestGetsWrong(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"a": "", "b": "", "c": ""})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	a, _ := r.lookup(t, e1, "a")
	a2, _ := r.lookup(t, e1, "a") // two lookups of a
	require.Equal(t, a.NodeId, a2.NodeId)
	b, _ := r.lookup(t, e1, "b")
	c, _ := r.lookup(t, e1, "c")
	nodes, _ := r.dev.Counts()
	require.Equal(t, 5, nodes)

	r.forget(t, 0, 1)
	r.forget(t, 1<<62, 1)
	r.forget(t, fuse.FUSE_ROOT_ID, ^uint64(0))
	r.forget(t, a.NodeId, 1)
	_, errno := r.getattr(t, a.NodeId)
	require.Zero(t, errno, "one of two lookups forgotten: still held")
	r.forget(t, a.NodeId, 0)
	_, errno = r.getattr(t, a.NodeId)
	require.Zero(t, errno, "FORGET of 0 lookups forgets nothing")
	r.forget(t, a.NodeId, 5)
	_, errno = r.getattr(t, a.NodeId)
	require.Equal(t, syscall.ESTALE, errno, "more than looked up: forgotten")
	r.forget(t, a.NodeId, 1) // twice
	_, errno = r.getattr(t, fuse.FUSE_ROOT_ID)
	require.Zero(t, errno, "the root is never forgotten")

	// BATCH_FORGET: count says 4, two entries follow (b, unknown).
	msg, _ := r.encode(opBatchForget, 0, &batchForgetIn{Count: 4},
		le(&forgetOne{b.NodeId, 1}), le(&forgetOne{999, 1}))
	u := r.send(t, hiprioQueue, msg, 0)
	require.Zero(t, u.Len)
	_, errno = r.getattr(t, b.NodeId)
	require.Equal(t, syscall.ESTALE, errno, "the entries present are forgotten")
	_, errno = r.getattr(t, c.NodeId)
	require.Zero(t, errno)
	// A FORGET on the request queue works too, with no reply.
	msg, _ = r.encode(opForget, c.NodeId, &struct{ N uint64 }{1})
	u = r.send(t, requestQueue, msg, 4096)
	require.Zero(t, u.Len, "FORGET has no reply")
	_, errno = r.getattr(t, c.NodeId)
	require.Equal(t, syscall.ESTALE, errno)

	nodes, _ = r.dev.Counts()
	require.Equal(t, 2, nodes, "root and e1")
	fresh, errno := r.lookup(t, e1, "a")
	require.Zero(t, errno)
	require.Greater(t, fresh.NodeId, c.NodeId, "a forgotten id is never given again")
}

// Unknown ids are ESTALE (nodes) or EBADF (handles); a handle of the other
// kind is EBADF; the id go-fuse keeps for itself reaches no host file.
func TestUnknownIdsAndHandlesOfTheOtherKind(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "x", "d/g": ""})
	r.initSession(t)
	f := r.walk(t, "e1", "f")
	d := r.walk(t, "e1", "d")

	for _, id := range []uint64{0, 999, 1 << 63} {
		for name, errno := range map[string]syscall.Errno{
			"lookup":  func() syscall.Errno { _, e := r.lookup(t, id, "f"); return e }(),
			"getattr": func() syscall.Errno { _, e := r.getattr(t, id); return e }(),
			"setattr": func() syscall.Errno { _, e := r.setattr(t, id, setattrIn{Valid: fuse.FATTR_SIZE}); return e }(),
			"open":    func() syscall.Errno { _, e := r.open(t, id, syscall.O_RDONLY); return e }(),
			"opendir": func() syscall.Errno { _, e := r.opendir(t, id); return e }(),
			"mkdir":   func() syscall.Errno { _, e := r.mkdir(t, id, "x", 0o755); return e }(),
			"statfs":  func() syscall.Errno { _, e := r.statfs(t, id); return e }(),
			"link":    func() syscall.Errno { _, e := r.link(t, id, d, "x"); return e }(),
			"rename":  r.rename(t, d, "g", id, "x"),
		} {
			require.Equal(t, syscall.ESTALE, errno, "%s of node %d", name, id)
		}
	}
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	dh, errno := r.opendir(t, d)
	require.Zero(t, errno)
	for name, errno := range map[string]syscall.Errno{
		"read-unknown":      func() syscall.Errno { _, e := r.read(t, f, 999, 0, 1); return e }(),
		"write-unknown":     func() syscall.Errno { _, e := r.write(t, f, 0, 0, []byte("x")); return e }(),
		"read-dirhandle":    func() syscall.Errno { _, e := r.read(t, f, dh.Fh, 0, 1); return e }(),
		"write-dirhandle":   func() syscall.Errno { _, e := r.write(t, d, dh.Fh, 0, []byte("x")); return e }(),
		"readdir-filehndl":  r.call(t, opReaddir, d, &readIn{Fh: fh, Size: 4096}).errno,
		"readdirplus-file":  r.call(t, opReaddirplus, d, &readIn{Fh: fh, Size: 4096}).errno,
		"readdir-unknown":   r.call(t, opReaddir, d, &readIn{Fh: 1 << 40, Size: 4096}).errno,
		"fsyncdir-filehndl": r.fsync(t, d, fh, opFsyncdir),
	} {
		require.Equal(t, syscall.EBADF, errno, name)
	}

	// go-fuse answers for node ^0 itself (its epoll workaround) without
	// reaching the file system: no host file changes, no node appears.
	before := snapshot(t, dir)
	nodes, handles := r.dev.Counts()
	_, _ = r.setattr(t, ^uint64(0), setattrIn{Valid: fuse.FATTR_SIZE | fuse.FATTR_MODE, Mode: 0o777})
	_, _ = r.open(t, ^uint64(0), syscall.O_RDWR|syscall.O_TRUNC)
	_, _ = r.mkdir(t, ^uint64(0), "x", 0o755)
	_, _ = r.lookup(t, fuse.FUSE_ROOT_ID, ".go-fuse-epoll-hack")
	require.Equal(t, before, snapshot(t, dir))
	n2, h2 := r.dev.Counts()
	require.Equal(t, nodes, n2)
	require.Equal(t, handles, h2)
}

// A chain with more readable bytes than the device takes is answered with
// E2BIG and not run; one of exactly that size is run.
func TestRequestLargerThanMaxMessageIsE2BIG(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "keep"})
	r.initSession(t)
	f := r.walk(t, "e1", "f")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)

	hdr := binary.Size(fuse.InHeader{}) + binary.Size(writeIn{})
	big := bytes.Repeat([]byte{'B'}, maxMessage+1-hdr)
	msg, unique := r.encode(opWrite, f, &writeIn{Fh: fh, Size: uint32(len(big))}, big)
	require.Len(t, msg, maxMessage+1)
	u := r.send(t, requestQueue, msg, 4096)
	require.True(t, isErrorHeader(u.Data, unique, syscall.E2BIG), "got %x", u.Data)
	got, _ := os.ReadFile(filepath.Join(dir, "f"))
	require.Equal(t, "keep", string(got), "not run")

	// Split over several readable buffers: the same.
	u2 := r.sendBufs(t, requestQueue, []virtiotest.Buffer{
		virtiotest.Readable(msg[:100]), virtiotest.Readable(msg[100 : maxMessage/2]), virtiotest.Readable(msg[maxMessage/2:]), virtiotest.Writable(64),
	})
	require.True(t, isErrorHeader(u2.Data, unique, syscall.E2BIG))

	fits := big[:len(big)-1]
	n, errno := r.write(t, f, fh, 0, fits)
	require.Zero(t, errno, "exactly maxMessage readable bytes")
	require.EqualValues(t, len(fits), n)
	st, _ := os.Stat(filepath.Join(dir, "f"))
	require.EqualValues(t, len(fits), st.Size())
}

// sendBufs sends one chain of the given buffers and waits for it.
func (r *rig) sendBufs(t testing.TB, q int, bufs []virtiotest.Buffer) virtiotest.Used {
	t.Helper()
	dq := r.drv.Queue(q)
	_, err := dq.Add(bufs...)
	require.NoError(t, err)
	dq.Kick()
	u, err := dq.Wait(waitLimit)
	require.NoError(t, err)
	return u
}

// A reply that does not fit the chain's writable room is an error header
// when 16 bytes fit, nothing otherwise; the request is not run, and the
// device serves on.
func TestReplyRoomTooSmall(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "0123456789"})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	f := r.walk(t, "e1", "f")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	nodes, handles := r.dev.Counts()

	lookup, lu := r.encode(opLookup, e1, nil, cstr("f"))
	for _, room := range []uint32{1, 8, 15} {
		u := r.send(t, requestQueue, lookup, room)
		require.Zero(t, u.Len, "%d bytes of room: no reply fits", room)
	}
	for _, room := range []uint32{16, 17, 100, 143} {
		u := r.send(t, requestQueue, lookup, room)
		require.True(t, isErrorHeader(u.Data, lu, syscall.EIO), "%d bytes of room: %x", room, u.Data)
	}
	u := r.send(t, requestQueue, lookup, 144)
	require.EqualValues(t, 144, u.Len, "header and entry fit exactly")

	read, ru := r.encode(opRead, f, &readIn{Fh: fh, Size: 4096})
	u = r.send(t, requestQueue, read, 100)
	require.True(t, isErrorHeader(u.Data, ru, syscall.EIO), "a READ asking for more than the room")

	write, wu := r.encode(opWrite, f, &writeIn{Fh: fh, Size: 3}, []byte("abc"))
	u = r.send(t, requestQueue, write, 20)
	require.True(t, isErrorHeader(u.Data, wu, syscall.EIO))
	// The same with the room in pieces smaller than a header.
	u = r.sendBufs(t, requestQueue, []virtiotest.Buffer{virtiotest.Readable(write), virtiotest.Writable(5), virtiotest.Writable(5), virtiotest.Writable(6)})
	require.EqualValues(t, 16, u.Len)
	require.True(t, isErrorHeader(u.Data, wu, syscall.EIO), "an error header across three buffers: %x", u.Data)

	got, _ := os.ReadFile(filepath.Join(dir, "f"))
	require.Equal(t, "0123456789", string(got), "a WRITE whose reply has no room is not run")
	n2, h2 := r.dev.Counts()
	require.Equal(t, nodes, n2, "a LOOKUP whose reply has no room enters no node")
	require.Equal(t, handles, h2)
	_, errno = r.lookup(t, e1, "f")
	require.Zero(t, errno, "still serving")
}

// A chain of readable buffers only: no reply (there is nowhere to put
// one), the request is not run, and the device serves on.
func TestChainWithOnlyReadableBuffers(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"f": "keep"})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	f := r.walk(t, "e1", "f")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)
	nodes, handles := r.dev.Counts()

	for _, msg := range [][]byte{
		func() []byte { m, _ := r.encode(opLookup, e1, nil, cstr("f")); return m }(),
		func() []byte { m, _ := r.encode(opWrite, f, &writeIn{Fh: fh, Size: 4}, []byte("LOST")); return m }(),
		func() []byte {
			m, _ := r.encode(opCreate, e1, &createIn{Flags: syscall.O_RDWR, Mode: 0o644}, cstr("new"))
			return m
		}(),
		func() []byte { m, _ := r.encode(opUnlink, e1, nil, cstr("f")); return m }(),
		{1, 2, 3},
	} {
		u := r.sendBufs(t, requestQueue, []virtiotest.Buffer{virtiotest.Readable(msg[:len(msg)/2+1]), virtiotest.Readable(msg[len(msg)/2+1:])})
		require.Zero(t, u.Len)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	require.NoError(t, err)
	require.Equal(t, "keep", string(got))
	require.NoFileExists(t, filepath.Join(dir, "new"))
	n2, h2 := r.dev.Counts()
	require.Equal(t, nodes, n2)
	require.Equal(t, handles, h2)
	_, errno = r.lookup(t, e1, "f")
	require.Zero(t, errno)
}

// Requests and replies split across many buffers at odd places, headers
// included, give the same results as in one piece (go-fuse reads and
// writes the chain as byte streams).
func TestRequestsAndRepliesSplitAtOddPlaces(t *testing.T) {
	r := newRig(t, Options{})
	content := bytes.Repeat([]byte("abcdefghij"), 1000)
	dir := r.export(t, "e1", false, map[string]string{"f": string(content), "g": ""})
	r.initSession(t)
	e1 := r.walk(t, "e1")
	f := r.walk(t, "e1", "f")
	fh, errno := r.open(t, f, syscall.O_RDWR)
	require.Zero(t, errno)

	split := func(msg []byte, at ...int) []virtiotest.Buffer {
		var bufs []virtiotest.Buffer
		prev := 0
		for _, a := range at {
			bufs = append(bufs, virtiotest.Readable(msg[prev:a]))
			prev = a
		}
		return append(bufs, virtiotest.Readable(msg[prev:]))
	}
	header := func(t *testing.T, data []byte, unique uint64) []byte {
		t.Helper()
		require.GreaterOrEqual(t, len(data), 16)
		require.EqualValues(t, len(data), binary.LittleEndian.Uint32(data))
		require.Zero(t, errnoAt(t, data))
		require.Equal(t, unique, binary.LittleEndian.Uint64(data[8:]))
		return data[16:]
	}

	// LOOKUP: the name split, the header split.
	msg, unique := r.encode(opLookup, e1, nil, cstr("f"))
	u := r.sendBufs(t, requestQueue, append(split(msg, 3, 17, 40, 41), virtiotest.Writable(7), virtiotest.Writable(9), virtiotest.Writable(3), virtiotest.Writable(500)))
	var e fuse.EntryOut
	reply{payload: header(t, u.Data, unique)}.ok(t, &e)
	require.Equal(t, f, e.NodeId)
	require.EqualValues(t, len(content), e.Attr.Size)

	// READ into a reply of odd pieces.
	msg, unique = r.encode(opRead, f, &readIn{Fh: fh, Offset: 5, Size: 9000})
	u = r.sendBufs(t, requestQueue, append(split(msg, 1, 39, 50), virtiotest.Writable(1), virtiotest.Writable(20), virtiotest.Writable(4095), virtiotest.Writable(3), virtiotest.Writable(6000)))
	require.Equal(t, content[5:9005], header(t, u.Data, unique))

	// WRITE whose data is in several pieces.
	data := bytes.Repeat([]byte("0123456789ABCDEF"), 700)
	msg, unique = r.encode(opWrite, f, &writeIn{Fh: fh, Offset: 100, Size: uint32(len(data))}, data)
	u = r.sendBufs(t, requestQueue, append(split(msg, 20, 80, 81, 2000, 5000, 11000), virtiotest.Writable(11), virtiotest.Writable(13)))
	var w fuse.WriteOut
	reply{payload: header(t, u.Data, unique)}.ok(t, &w)
	require.EqualValues(t, len(data), w.Size)
	got, _ := os.ReadFile(filepath.Join(dir, "f"))
	want := append(append([]byte{}, content[:100]...), data...)
	require.Equal(t, want, got)

	// RENAME with both names split across buffers.
	msg, unique = r.encode(opRename, e1, &renameIn{Newdir: e1}, cstr("g"), cstr("renamed"))
	u = r.sendBufs(t, requestQueue, append(split(msg, 48, 49, 50, 52), virtiotest.Writable(16)))
	header(t, u.Data, unique)
	require.FileExists(t, filepath.Join(dir, "renamed"))

	// READDIRPLUS into pieces.
	o, errno := r.opendir(t, e1)
	require.Zero(t, errno)
	msg, unique = r.encode(opReaddirplus, e1, &readIn{Fh: o.Fh, Size: 4096})
	u = r.sendBufs(t, requestQueue, []virtiotest.Buffer{virtiotest.Readable(msg), virtiotest.Writable(5), virtiotest.Writable(150), virtiotest.Writable(4000)})
	require.NotEmpty(t, header(t, u.Data, unique))
}

// FUSE_INIT with a major version other than 7 or too old a minor is
// refused with an error reply; a good one afterwards works.
func TestInitWithAWrongVersionIsRefused(t *testing.T) {
	r := newRig(t, Options{})
	type initIn struct {
		Major, Minor, MaxReadAhead, Flags, Flags2 uint32
		Unused                                    [11]uint32
	}
	for _, v := range []initIn{{Major: 6, Minor: 36}, {Major: 8, Minor: 0}, {Major: 0}, {Major: ^uint32(0)}, {Major: 7, Minor: 11}} {
		rp := r.call(t, opInit, 0, &v)
		require.Equal(t, syscall.EIO, rp.errno, "INIT %d.%d", v.Major, v.Minor)
		require.Empty(t, rp.payload)
	}
	// An INIT too short for its fixed part.
	rp := r.call(t, opInit, 0, &struct{ Major uint32 }{7})
	require.NotZero(t, rp.errno)
	out := r.initSession(t)
	require.EqualValues(t, 7, out.Major)
	require.EqualValues(t, 28, out.Minor, "the minor go-fuse speaks")
}

// A reset while many requests are in flight returns once they are done,
// leaves no descriptor open and no node or handle counted, and a new
// activation serves again.
func TestResetAmidManyRequestsInFlight(t *testing.T) {
	r := newRig(t, Options{MaxInFlight: 4})
	files := map[string]string{"big": string(make([]byte, 1<<20))}
	for i := range 20 {
		files["d/f"+itoa(i)] = "x"
	}
	r.export(t, "e1", false, files)
	r.initSession(t)
	baseline := openFds(t)
	big := r.walk(t, "e1", "big")
	d := r.walk(t, "e1", "d")
	fh, errno := r.open(t, big, syscall.O_RDWR)
	require.Zero(t, errno)
	dh, errno := r.opendir(t, d)
	require.Zero(t, errno)

	q := r.drv.Queue(requestQueue)
	for i := range 60 {
		var msg []byte
		switch i % 5 {
		case 0:
			msg, _ = r.encode(opRead, big, &readIn{Fh: fh, Size: 1 << 20})
		case 1:
			msg, _ = r.encode(opWrite, big, &writeIn{Fh: fh, Offset: uint64(i) << 12, Size: 1 << 16}, make([]byte, 1<<16))
		case 2:
			msg, _ = r.encode(opReaddirplus, d, &readIn{Fh: dh.Fh, Size: 4096})
		case 3:
			msg, _ = r.encode(opLookup, d, nil, cstr("f"+itoa(i%20)))
		default:
			msg, _ = r.encode(opOpen, big, &openIn{Flags: syscall.O_RDONLY})
		}
		room := uint32(4096)
		if i%5 == 0 {
			room = 1<<20 + 64
		}
		_, err := q.Add(virtiotest.Readable(msg), virtiotest.Writable(room))
		require.NoError(t, err)
	}
	q.Kick()
	// Let the device start: the first replies arrive, more are running.
	_, err := q.Wait(waitLimit)
	require.NoError(t, err)

	done := make(chan struct{})
	go func() { r.dev.Reset(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitLimit):
		t.Fatal("Reset did not return")
	}
	// Nothing touches guest memory once Reset has returned.
	mem := make([]byte, r.drv.Mem.Size())
	require.NoError(t, r.drv.Mem.ReadAt(mem, 0))
	time.Sleep(20 * time.Millisecond)
	later := make([]byte, len(mem))
	require.NoError(t, r.drv.Mem.ReadAt(later, 0))
	require.True(t, bytes.Equal(mem, later), "guest memory written after Reset returned")
	nodes, handles := r.dev.Counts()
	require.Zero(t, nodes)
	require.Zero(t, handles)
	require.Equal(t, baseline, openFds(t), "every descriptor of the session closed")

	// The driver starts over on fresh RAM (a rebooted guest's rings): a
	// new session.
	r.drv.Reset()
	require.NoError(t, r.drv.Mem.WriteAt(make([]byte, r.drv.Mem.Size()), 0))
	require.NoError(t, r.drv.Init())
	r.initSession(t)
	nodes, handles = r.dev.Counts()
	require.Equal(t, 1, nodes, "only the root")
	require.Zero(t, handles)
	_, errno = r.lookup(t, fuse.FUSE_ROOT_ID, "e1")
	require.Zero(t, errno)
	_, errno = r.getattr(t, big)
	require.Equal(t, syscall.ESTALE, errno, "ids of the old session mean nothing")
}

// Device.Counts: 0 while inactive, the root once active, what the guest
// holds, 0 after a reset.
func TestCountsFollowTheSession(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"f": "x"})
	idle, err := New(Options{Tag: "idle", Root: r.exports, Logger: discardLogger()})
	require.NoError(t, err)
	n, h := idle.Counts()
	require.Zero(t, n+h, "inactive")
	idle.Close()

	r.initSession(t)
	n, h = r.dev.Counts()
	require.Equal(t, 1, n)
	require.Zero(t, h)
	f := r.walk(t, "e1", "f")
	_, errno := r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	_, errno = r.open(t, f, syscall.O_RDONLY)
	require.Zero(t, errno)
	n, h = r.dev.Counts()
	require.Equal(t, 3, n)
	require.Equal(t, 2, h)
	r.drv.Reset()
	n, h = r.dev.Counts()
	require.Zero(t, n+h, "after the driver's reset")
}

// INTERRUPT of a request that is not running is answered (EAGAIN), not
// left pending; repeated uniques each get their own reply.
func TestInterruptAndRepeatedUniques(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "e1", false, map[string]string{"a": "1", "bb": "22", "ccc": "333"})
	r.initSession(t)
	msg, unique := r.encode(opInterrupt, 0, &interruptIn{Unique: 123456})
	u := r.send(t, hiprioQueue, msg, 64)
	require.True(t, isErrorHeader(u.Data, unique, syscall.EAGAIN), "got %x", u.Data)

	e1 := r.walk(t, "e1")
	q := r.drv.Queue(requestQueue)
	want := map[uint64]string{}
	for range 4 {
		for _, name := range []string{"a", "bb", "ccc"} {
			m, _ := r.encode(opLookup, e1, nil, cstr(name))
			binary.LittleEndian.PutUint64(m[8:], 77) // every request the same unique
			head, err := q.Add(virtiotest.Readable(m), virtiotest.Writable(4096))
			require.NoError(t, err)
			want[uint64(head)] = name
		}
	}
	q.Kick()
	used, err := q.WaitN(len(want), waitLimit)
	require.NoError(t, err)
	for _, u := range used {
		var e fuse.EntryOut
		reply{payload: u.Data[16:]}.ok(t, &e)
		require.EqualValues(t, 77, binary.LittleEndian.Uint64(u.Data[8:]))
		require.EqualValues(t, len(want[uint64(u.Head)]), e.Attr.Size, "each chain gets the reply to its own request")
	}
}

// A READLINK reply is as long as the link's target, which the request does
// not announce: with too little room the reply is an error header, never a
// header claiming more bytes than were written.
func TestReadlinkReplyLargerThanTheRoom(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, nil)
	target := "../a/target/longer/than/the/room"
	require.NoError(t, os.Symlink(target, filepath.Join(dir, "lnk")))
	r.initSession(t)
	l := r.walk(t, "e1", "lnk")
	msg, unique := r.encode(opReadlink, l, nil)
	for _, room := range []uint32{16, 17, 30, uint32(16 + len(target) - 1)} {
		u := r.send(t, requestQueue, msg, room)
		require.True(t, isErrorHeader(u.Data, unique, syscall.EIO), "%d bytes of room: %x", room, u.Data)
	}
	u := r.send(t, requestQueue, msg, uint32(16+len(target)))
	require.EqualValues(t, 16+len(target), u.Len)
	require.EqualValues(t, u.Len, binary.LittleEndian.Uint32(u.Data))
	require.Equal(t, target, string(u.Data[16:]))
}
