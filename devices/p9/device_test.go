package p9

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

func TestConfigSpaceAndFeatures(t *testing.T) {
	dev, err := New(Options{Tag: "cowork", Attacher: fakeAttacher(nil)})
	require.NoError(t, err)
	assert.Equal(t, virtio.DeviceType9P, dev.Type())
	assert.Equal(t, FeatureMountTag, dev.Features()&FeatureMountTag)
	cfg := make([]byte, 8)
	dev.ReadConfig(0, cfg)
	assert.Equal(t, []byte{6, 0, 'c', 'o', 'w', 'o', 'r', 'k'}, cfg)
	part := make([]byte, 3)
	dev.ReadConfig(4, part)
	assert.Equal(t, []byte("wor"), part)
	beyond := []byte{0xAA}
	dev.ReadConfig(100, beyond)
	assert.Equal(t, []byte{0xAA}, beyond, "reads past the config space leave data alone")
	dev.WriteConfig(0, []byte{1, 2})
	dev.ReadConfig(0, cfg)
	assert.Equal(t, byte(6), cfg[0], "config space is read-only")

	_, err = New(Options{Tag: "", Attacher: fakeAttacher(nil)})
	assert.Error(t, err)
	_, err = New(Options{Tag: string(make([]byte, MaxTagLen+1)), Attacher: fakeAttacher(nil)})
	assert.Error(t, err)
	_, err = New(Options{Tag: "t"})
	assert.Error(t, err)
	_, err = New(Options{Tag: "t", Attacher: fakeAttacher(nil), QueueSize: 100})
	assert.Error(t, err, "queue size must be a power of two")
}

func clientWalk(t *testing.T, from p9lib.File, names ...string) p9lib.File {
	t.Helper()
	_, f, err := from.Walk(names)
	require.NoError(t, err, "walk %v", names)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func readAt(t *testing.T, f p9lib.File, n int) string {
	t.Helper()
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, 0)
	if err != io.EOF {
		require.NoError(t, err)
	}
	return string(buf[:got])
}

func TestFileOperationsThroughTheDevice(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "s", false, map[string]string{"a.txt": "alpha", "sub/b.txt": "beta"})
	c := r.client(t)
	root, err := c.Attach("s")
	require.NoError(t, err)
	defer root.Close()

	f := clientWalk(t, root, "sub", "b.txt")
	_, _, err = f.Open(p9lib.ReadOnly)
	require.NoError(t, err)
	assert.Equal(t, "beta", readAt(t, f, 100))
	_, valid, attr, err := f.GetAttr(p9lib.AttrMaskAll)
	require.NoError(t, err)
	assert.True(t, valid.Size)
	assert.Equal(t, uint64(4), attr.Size)

	d := clientWalk(t, root)
	nf, _, _, err := d.Create("c.txt", p9lib.ReadWrite, 0o644, p9lib.NoUID, p9lib.NoGID)
	require.NoError(t, err)
	payload := bytes.Repeat([]byte("0123456789"), 10_000) // spans several messages
	written := 0
	for written < len(payload) {
		n, err := nf.WriteAt(payload[written:min(len(payload), written+32*1024)], int64(written))
		require.NoError(t, err)
		written += n
	}
	require.NoError(t, nf.FSync())
	require.NoError(t, nf.Close())
	got, err := os.ReadFile(filepath.Join(dir, "c.txt"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(payload, got), "file written through 9p matches")

	_, err = root.Mkdir("m", 0o755, p9lib.NoUID, p9lib.NoGID)
	require.NoError(t, err)
	m := clientWalk(t, root, "m")
	require.NoError(t, root.RenameAt("c.txt", m, "c2.txt"))
	_, err = os.Stat(filepath.Join(dir, "m", "c2.txt"))
	require.NoError(t, err)

	g := clientWalk(t, root, "a.txt")
	require.NoError(t, g.SetAttr(p9lib.SetAttrMask{Size: true}, p9lib.SetAttr{Size: 2}))
	b, _ := os.ReadFile(filepath.Join(dir, "a.txt"))
	assert.Equal(t, "al", string(b))

	require.NoError(t, m.UnlinkAt("c2.txt", 0))
	require.NoError(t, root.UnlinkAt("m", unix.AT_REMOVEDIR))

	l := clientWalk(t, root)
	_, _, err = l.Open(p9lib.ReadOnly)
	require.NoError(t, err)
	ents, err := l.Readdir(0, 64*1024)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		if e.Name != "." && e.Name != ".." {
			names = append(names, e.Name)
		}
	}
	sort.Strings(names)
	assert.Equal(t, []string{"a.txt", "sub"}, names)

	// Read-only export through the device.
	r.export(t, "ro", true, map[string]string{"x": "x"})
	ro, err := c.Attach("ro")
	require.NoError(t, err)
	defer ro.Close()
	_, err = ro.Mkdir("no", 0o755, p9lib.NoUID, p9lib.NoGID)
	assert.ErrorIs(t, err, linux.EROFS)
	assert.ErrorIs(t, ro.UnlinkAt("x", 0), linux.EROFS)

	// Escapes through the device.
	_, _, err = root.Walk([]string{".."})
	assert.Error(t, err)
	require.NoError(t, os.Symlink("/etc", filepath.Join(dir, "etc-link")))
	_, _, err = root.Walk([]string{"etc-link", "passwd"})
	assert.Error(t, err)
}

// message builds a raw T-message.
func message(typ uint8, tag uint16, body []byte) []byte {
	b := make([]byte, headerSize+len(body))
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	b[4] = typ
	binary.LittleEndian.PutUint16(b[5:], tag)
	copy(b[headerSize:], body)
	return b
}

func str9(s string) []byte {
	b := make([]byte, 2+len(s))
	binary.LittleEndian.PutUint16(b, uint16(len(s)))
	copy(b[2:], s)
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// replyOf checks a reply's framing and returns its type, tag and body.
func replyOf(t testing.TB, data []byte) (uint8, uint16, []byte) {
	t.Helper()
	require.GreaterOrEqual(t, len(data), headerSize, "a reply")
	h := parseHeader(data)
	require.Equal(t, int(h.size), len(data), "reply size field matches the used length")
	return h.typ, h.tag, data[headerSize:]
}

func assertRlerror(t *testing.T, data []byte, tag uint16, errno linux.Errno) {
	t.Helper()
	typ, gotTag, body := replyOf(t, data)
	require.Equal(t, uint8(msgRlerror), typ, "Rlerror expected")
	assert.Equal(t, tag, gotTag)
	assert.Equal(t, uint32(errno), binary.LittleEndian.Uint32(body), "errno %v", errno)
}

func version(t testing.TB, r *rig, msize uint32) {
	t.Helper()
	u := r.roundTrip(t, message(msgTversion, noTag, cat(le32(msize), str9("9P2000.L"))), 4096)
	typ, tag, body := replyOf(t, u.Data)
	require.Equal(t, uint8(msgRversion), typ)
	assert.Equal(t, uint16(noTag), tag)
	assert.Equal(t, msize, binary.LittleEndian.Uint32(body))
}

func TestMalformedMessagesGetRlerror(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "s", false, nil)
	version(t, r, 8192)

	cases := []struct {
		name  string
		msg   []byte
		errno linux.Errno
	}{
		{"size below header", func() []byte { m := message(msgTclunk, 5, le32(1)); binary.LittleEndian.PutUint32(m, 3); return m }(), linux.EINVAL},
		{"size beyond buffers", func() []byte { m := message(msgTclunk, 5, le32(1)); binary.LittleEndian.PutUint32(m, 500); return m }(), linux.EINVAL},
		{"over msize", message(msgTwrite, 5, cat(le32(1), le64(0), le32(9000), make([]byte, 9000))), errMsgSize},
		{"unknown type", message(200, 5, nil), linux.EOPNOTSUPP},
		{"R-message from the guest", message(msgRversion, 5, cat(le32(8192), str9("9P2000.L"))), linux.EOPNOTSUPP},
		{"short body", message(msgTwalk, 5, le32(0)), linux.EINVAL},
		{"walk names past the end", message(msgTwalk, 5, cat(le32(0), le32(1), []byte{3, 0}, str9("a"))), linux.EINVAL},
		{"string length past the end", message(msgTattach, 5, cat(le32(0), le32(noFid), []byte{0xff, 0xff})), linux.EINVAL},
		{"write count mismatch", message(msgTwrite, 5, cat(le32(1), le64(0), le32(10), []byte("abc"))), linux.EINVAL},
		{"write count overflow", message(msgTwrite, 5, cat(le32(1), le64(0), le32(0xFFFFFFFF), []byte("abc"))), linux.EINVAL},
		// Twrites of pooledMessageMin bytes or more are streamed from the chain.
		{"streamed write count mismatch", message(msgTwrite, 5, cat(le32(1), le64(0), le32(100), make([]byte, 8192-headerSize-twriteFixedSize))), linux.EINVAL},
		{"streamed write count overflow", message(msgTwrite, 5, cat(le32(1), le64(0), le32(0xFFFFFFFF), make([]byte, 8192-headerSize-twriteFixedSize))), linux.EINVAL},
		{"streamed write to an unknown fid", message(msgTwrite, 5, cat(le32(77), le64(0), le32(8192-headerSize-twriteFixedSize), make([]byte, 8192-headerSize-twriteFixedSize))), linux.EBADF},
		{"attach with NOFID", message(msgTattach, 5, cat(le32(noFid), le32(noFid), str9(""), str9("s"), le32(0))), linux.EINVAL},
	}
	for _, tc := range cases {
		u := r.roundTrip(t, tc.msg, 4096)
		assertRlerror(t, u.Data, 5, tc.errno)
	}

	// Chains too small to answer complete with length 0.
	u := r.roundTrip(t, []byte{1, 2, 3}, 4096)
	assert.Zero(t, u.Len, "readable part shorter than a header")
	u = r.roundTrip(t, message(msgTclunk, 5, le32(1)), 4)
	assert.Zero(t, u.Len, "writable part too small for Rlerror")

	// A reply larger than the writable buffers: Rlerror instead of a cut reply.
	u = r.roundTrip(t, message(msgTattach, 9, cat(le32(1), le32(noFid), str9(""), str9("s"), le32(0))), 4096)
	typ, _, _ := replyOf(t, u.Data)
	require.Equal(t, uint8(105), typ, "Rattach")
	u = r.roundTrip(t, message(msgTgetattr, 10, cat(le32(1), le64(0x3fff))), rlerrorSize)
	assertRlerror(t, u.Data, 10, errMsgSize)

	// The device (and the server) still serve.
	version(t, r, 8192)
}

func TestDeviceAnswersXattrAndGetlockItself(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "s", false, map[string]string{"f": "x"})
	version(t, r, 8192)
	u := r.roundTrip(t, message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9("s"), le32(0))), 4096)
	typ, _, _ := replyOf(t, u.Data)
	require.Equal(t, uint8(105), typ)

	u = r.roundTrip(t, message(msgTxattrwalk, 2, cat(le32(1), le32(2), str9("security.capability"))), 4096)
	assertRlerror(t, u.Data, 2, linux.ENODATA)
	u = r.roundTrip(t, message(msgTxattrwalk, 3, cat(le32(1), le32(2), str9(""))), 4096)
	assertRlerror(t, u.Data, 3, linux.EOPNOTSUPP)
	u = r.roundTrip(t, message(msgTxattrcreate, 4, cat(le32(1), str9("user.x"), le64(1), le32(0))), 4096)
	assertRlerror(t, u.Data, 4, linux.EOPNOTSUPP)

	u = r.roundTrip(t, message(msgTgetlock, 5, cat(le32(1), []byte{1}, le64(10), le64(20), le32(77), str9("guest"))), 4096)
	typ, tag, body := replyOf(t, u.Data)
	assert.Equal(t, uint8(msgRgetlock), typ)
	assert.Equal(t, uint16(5), tag)
	assert.Equal(t, cat([]byte{lockTypeUnlocked}, le64(10), le64(20), le32(77), str9("guest")), body)
}

func TestGuestTagReuseDoesNotLoseReplies(t *testing.T) {
	r := newRig(t, Options{})
	r.export(t, "s", false, nil)
	version(t, r, 8192)
	// Two requests with the same guest tag in flight at once.
	attach := func(fid uint32) []byte {
		return message(msgTattach, 7, cat(le32(fid), le32(noFid), str9(""), str9("s"), le32(0)))
	}
	_, err := r.q.Add(vtReadable(attach(1)), vtWritable(4096))
	require.NoError(t, err)
	_, err = r.q.Add(vtReadable(attach(2)), vtWritable(4096))
	require.NoError(t, err)
	r.q.Kick()
	used, err := r.q.WaitN(2, waitLimit)
	require.NoError(t, err)
	for _, u := range used {
		typ, tag, _ := replyOf(t, u.Data)
		assert.Equal(t, uint8(105), typ)
		assert.Equal(t, uint16(7), tag)
	}
}

func TestRequestsRunConcurrently(t *testing.T) {
	release := make(chan struct{})
	att := fakeAttacher(release)
	dev, err := New(Options{Tag: "fake", Attacher: att, Logger: discardLogger()})
	require.NoError(t, err)
	defer dev.Close()
	drv := newDriverFor(t, dev)
	q := drv.Queue(0)

	send := func(msg []byte) {
		_, err := q.Add(vtReadable(msg), vtWritable(4096))
		require.NoError(t, err)
		q.Kick()
	}
	send(message(msgTversion, noTag, cat(le32(8192), str9("9P2000.L"))))
	_, err = q.Wait(waitLimit)
	require.NoError(t, err)
	send(message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9(""), le32(0))))
	_, err = q.Wait(waitLimit)
	require.NoError(t, err)
	send(message(msgTlopen, 2, cat(le32(1), le32(0))))
	_, err = q.Wait(waitLimit)
	require.NoError(t, err)

	// A read that blocks in the file system, then a getattr.
	send(message(msgTread, 3, cat(le32(1), le64(0), le32(10))))
	<-att.readStarted
	send(message(msgTgetattr, 4, cat(le32(1), le64(0x3fff))))
	u, err := q.Wait(waitLimit)
	require.NoError(t, err)
	_, tag, _ := replyOf(t, u.Data)
	assert.Equal(t, uint16(4), tag, "the getattr answers while the read is still blocked")
	close(release)
	u, err = q.Wait(waitLimit)
	require.NoError(t, err)
	typ, tag, _ := replyOf(t, u.Data)
	assert.Equal(t, uint16(3), tag)
	assert.Equal(t, uint8(117), typ, "Rread")
}

func TestResetClunksEveryFid(t *testing.T) {
	att := fakeAttacher(nil)
	dev, err := New(Options{Tag: "fake", Attacher: att, Logger: discardLogger()})
	require.NoError(t, err)
	defer dev.Close()
	drv := newDriverFor(t, dev)
	q := drv.Queue(0)
	rt := func(msg []byte) []byte {
		_, err := q.Add(vtReadable(msg), vtWritable(4096))
		require.NoError(t, err)
		q.Kick()
		u, err := q.Wait(waitLimit)
		require.NoError(t, err)
		return u.Data
	}
	rt(message(msgTversion, noTag, cat(le32(8192), str9("9P2000.L"))))
	rt(message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9(""), le32(0))))
	rt(message(msgTwalk, 2, cat(le32(1), le32(2), []byte{0, 0})))
	rt(message(msgTwalk, 3, cat(le32(1), le32(3), []byte{0, 0})))
	assert.Equal(t, int64(3), att.open.Load(), "three files held")

	drv.Reset()
	// A rebooted guest's rings start zeroed; virtiotest reuses freed
	// memory as is, so clear it the way fresh RAM would be.
	require.NoError(t, drv.Mem.WriteAt(make([]byte, drv.Mem.Size()), 0))
	require.NoError(t, drv.Init())
	q = drv.Queue(0)
	// The new activation waits for the clunks: once it answers, they're done.
	rt(message(msgTversion, noTag, cat(le32(8192), str9("9P2000.L"))))
	assert.Equal(t, int64(0), att.open.Load(), "every fid of the old guest was clunked")
	// And the fid numbers are free for the new guest.
	data := rt(message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9(""), le32(0))))
	typ, _, _ := replyOf(t, data)
	assert.Equal(t, uint8(105), typ)
}

func TestMaxFids(t *testing.T) {
	r := newRig(t, Options{MaxFids: 2})
	r.export(t, "s", false, nil)
	version(t, r, 8192)
	u := r.roundTrip(t, message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9("s"), le32(0))), 4096)
	typ, _, _ := replyOf(t, u.Data)
	require.Equal(t, uint8(105), typ)
	u = r.roundTrip(t, message(msgTwalk, 2, cat(le32(1), le32(2), []byte{0, 0})), 4096)
	typ, _, _ = replyOf(t, u.Data)
	require.Equal(t, uint8(111), typ, "Rwalk")
	u = r.roundTrip(t, message(msgTwalk, 3, cat(le32(1), le32(3), []byte{0, 0})), 4096)
	assertRlerror(t, u.Data, 3, linux.ENFILE)
	u = r.roundTrip(t, message(msgTclunk, 4, le32(2)), 4096)
	typ, _, _ = replyOf(t, u.Data)
	require.Equal(t, uint8(121), typ, "Rclunk")
	u = r.roundTrip(t, message(msgTwalk, 5, cat(le32(1), le32(3), []byte{0, 0})), 4096)
	typ, _, _ = replyOf(t, u.Data)
	assert.Equal(t, uint8(111), typ, "a clunked fid frees its place")
}

// ----- a fake file system whose reads can block -----

type fakeFS struct {
	release     chan struct{} // nil: reads do not block
	readStarted chan struct{}
	once        sync.Once
	open        atomic.Int64
}

func fakeAttacher(release chan struct{}) *fakeFS {
	return &fakeFS{release: release, readStarted: make(chan struct{})}
}

func (f *fakeFS) Attach() (p9lib.File, error) {
	f.open.Add(1)
	return &fakeFile{fs: f}, nil
}

// fakeFile implements what the tests use; anything else panics (a nil
// embedded File), which the device's guard turns into EIO (guard.go).
type fakeFile struct {
	p9lib.File
	fs *fakeFS
}

func (f *fakeFile) Walk(names []string) ([]p9lib.QID, p9lib.File, error) {
	if len(names) != 0 {
		return nil, nil, linux.ENOENT
	}
	f.fs.open.Add(1)
	return nil, &fakeFile{fs: f.fs}, nil
}

func (f *fakeFile) GetAttr(p9lib.AttrMask) (p9lib.QID, p9lib.AttrMask, p9lib.Attr, error) {
	return p9lib.QID{Type: p9lib.TypeRegular, Path: 1}, p9lib.AttrMask{Mode: true, Size: true},
		p9lib.Attr{Mode: p9lib.ModeRegular | 0o644, Size: 10}, nil
}

func (f *fakeFile) Open(p9lib.OpenFlags) (p9lib.QID, uint32, error) {
	return p9lib.QID{Type: p9lib.TypeRegular, Path: 1}, 0, nil
}

func (f *fakeFile) ReadAt(p []byte, _ int64) (int, error) {
	if f.fs.release != nil {
		f.fs.once.Do(func() { close(f.fs.readStarted) })
		<-f.fs.release
	}
	return copy(p, "0123456789"), nil
}

func (f *fakeFile) Close() error {
	f.fs.open.Add(-1)
	return nil
}

func TestMsizeIsCapped(t *testing.T) {
	r := newRig(t, Options{MaxMessageSize: 16 << 10})
	u := r.roundTrip(t, message(msgTversion, noTag, cat(le32(1<<20), str9("9P2000.L"))), 4096)
	typ, _, body := replyOf(t, u.Data)
	require.Equal(t, uint8(msgRversion), typ)
	assert.Equal(t, uint32(16<<10), binary.LittleEndian.Uint32(body), "the guest is told the cap")
	big := message(msgTwrite, 5, cat(le32(1), le64(0), le32(20<<10), make([]byte, 20<<10)))
	u = r.roundTrip(t, big, 4096)
	assertRlerror(t, u.Data, 5, errMsgSize)
	u = r.roundTrip(t, message(msgTversion, noTag, cat(le32(100), str9("9P2000.L"))), 4096)
	assertRlerror(t, u.Data, noTag, linux.EINVAL)
}

func TestFlushOfUnknownTagAnswers(t *testing.T) {
	r := newRig(t, Options{})
	version(t, r, 8192)
	u := r.roundTrip(t, message(msgTflush, 3, []byte{42, 0}), 4096)
	typ, tag, _ := replyOf(t, u.Data)
	assert.Equal(t, uint8(109), typ, "Rflush")
	assert.Equal(t, uint16(3), tag)
}

func TestFlushWaitsForTheFlushedRequest(t *testing.T) {
	release := make(chan struct{})
	att := fakeAttacher(release)
	dev, err := New(Options{Tag: "fake", Attacher: att, Logger: discardLogger()})
	require.NoError(t, err)
	defer dev.Close()
	q := newDriverFor(t, dev).Queue(0)
	send := func(msg []byte) {
		_, err := q.Add(vtReadable(msg), vtWritable(4096))
		require.NoError(t, err)
		q.Kick()
	}
	for _, m := range [][]byte{
		message(msgTversion, noTag, cat(le32(8192), str9("9P2000.L"))),
		message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9(""), le32(0))),
		message(msgTlopen, 2, cat(le32(1), le32(0))),
	} {
		send(m)
		_, err := q.Wait(waitLimit)
		require.NoError(t, err)
	}
	send(message(msgTread, 3, cat(le32(1), le64(0), le32(10))))
	<-att.readStarted
	send(message(msgTflush, 4, []byte{3, 0})) // flush guest tag 3
	close(release)
	used, err := q.WaitN(2, waitLimit)
	require.NoError(t, err)
	tags := map[uint16]uint8{}
	for _, u := range used {
		typ, tag, _ := replyOf(t, u.Data)
		tags[tag] = typ
	}
	assert.Equal(t, map[uint16]uint8{3: 117, 4: 109}, tags, "Rread for tag 3, Rflush for tag 4")
}
