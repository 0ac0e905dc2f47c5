package virtiofs

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/require"
)

func TestConfigSpaceCarriesTagAndOneRequestQueue(t *testing.T) {
	r := newRig(t, Options{Tag: "cowork-sys"})
	cfg := make([]byte, configSize)
	r.drv.ReadConfig(0, cfg)
	require.Equal(t, "cowork-sys", string(bytes.TrimRight(cfg[:MaxTagLen], "\x00")))
	require.Equal(t, []byte{1, 0, 0, 0}, cfg[MaxTagLen:])
}

func TestNewRefusesBadOptions(t *testing.T) {
	exports := newRig(t, Options{}).exports
	for _, opts := range []Options{
		{Root: exports},
		{Tag: string(make([]byte, MaxTagLen+1)), Root: exports},
		{Tag: "x"},
		{Tag: "x", Root: exports, QueueSize: 100},
		{Tag: "x", Root: exports, NoOpen: true}, // NoOpen needs Cached
	} {
		_, err := New(opts)
		require.Error(t, err, "%+v", opts)
	}
}

func TestInitNegotiatesMaxWrite(t *testing.T) {
	r := newRig(t, Options{})
	out := r.initSession(t)
	require.EqualValues(t, 7, out.Major)
	require.EqualValues(t, MaxWrite, out.MaxWrite)
	require.EqualValues(t, MaxWrite/os.Getpagesize(), out.MaxPages)
	require.NotZero(t, out.Flags&uint32(fuse.CAP_READDIRPLUS))
}

// linuxHeaderDescriptors is what Linux's virtio-fs driver keeps of a
// queue's descriptors for a request's headers: it caps a request's pages
// at the queue size minus this (FUSE_HEADER_OVERHEAD, fs/fuse/virtio_fs.c).
const linuxHeaderDescriptors = 4

// TestDefaultQueueHoldsTheLargestRequest: with the default queue size,
// Linux's driver can send a READ or WRITE of the max_pages FUSE_INIT
// offers. A smaller queue cuts every large request short (256 entries
// gave 252 pages: each MiB read as 1008 KiB and 16 KiB, twice the
// requests).
func TestDefaultQueueHoldsTheLargestRequest(t *testing.T) {
	r := newRig(t, Options{})
	out := r.initSession(t)
	for i, size := range r.dev.QueueMaxSizes() {
		require.GreaterOrEqual(t, int(size)-linuxHeaderDescriptors, int(out.MaxPages), "queue %d", i)
	}
}

func TestLookupReadAndWriteAFile(t *testing.T) {
	r := newRig(t, Options{})
	dir := r.export(t, "e1", false, map[string]string{"a/hello.txt": "hello, guest"})
	r.initSession(t)
	node := r.walk(t, "e1", "a", "hello.txt")
	e, errno := r.lookup(t, r.walk(t, "e1", "a"), "hello.txt")
	require.Zero(t, errno)
	require.Equal(t, node, e.NodeId, "one node per inode")
	require.EqualValues(t, len("hello, guest"), e.Attr.Size)
	require.EqualValues(t, 1, e.EntryValid, "an uncached device gives a second's entry lifetime")

	fh, errno := r.open(t, node, syscall.O_RDWR)
	require.Zero(t, errno)
	data, errno := r.read(t, node, fh, 7, 100)
	require.Zero(t, errno)
	require.Equal(t, "guest", string(data))

	n, errno := r.write(t, node, fh, 7, []byte("host!"))
	require.Zero(t, errno)
	require.EqualValues(t, 5, n)
	got, err := os.ReadFile(filepath.Join(dir, "a/hello.txt"))
	require.NoError(t, err)
	require.Equal(t, "hello, host!", string(got))
	r.release(t, node, fh, opRelease)
	_, handles := r.dev.Counts()
	require.Zero(t, handles)
}

func TestReaddirAndReaddirplus(t *testing.T) {
	r := newRig(t, Options{})
	files := map[string]string{}
	for i := range 300 {
		files[filepath.Join("d", "file-with-a-longish-name-"+string(rune('a'+i%26))+"-"+itoa(i))] = "x"
	}
	r.export(t, "e1", true, files)
	r.initSession(t)
	d := r.walk(t, "e1", "d")
	for _, op := range []uint32{opReaddir, opReaddirplus} {
		rp := r.call(t, opOpendir, d, &openIn{})
		var o fuse.OpenOut
		rp.ok(t, &o)
		names := r.readdir(t, d, o.Fh, op)
		require.Len(t, names, 302, "op %d: 300 files, . and ..", op)
		r.release(t, d, o.Fh, opReleasedir)
	}
	nodes, _ := r.dev.Counts()
	require.Equal(t, 3+300, nodes, "root, e1, d and the 300 files READDIRPLUS looked up")
}

func itoa(i int) string {
	return string([]byte{byte('0' + i/100), byte('0' + i/10%10), byte('0' + i%10)})
}
