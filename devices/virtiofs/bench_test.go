package virtiofs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// The benchmarks move 1 MiB a request the way the guest's page cache does
// (one 4 KiB buffer a page, in an indirect table) through the device; the
// chain is laid out once and made available again each time, so the
// driver's part is two ring indices. Each has a peer, "bare", that moves
// the same bytes between the same file and 256 page-sized buffers with one
// preadv or pwritev and nothing else: device ÷ bare is what a request
// costs beyond the copy every design makes.
const (
	benchPage  = 4096
	benchPages = 256
	benchSize  = benchPage * benchPages
)

// benchOpen exports a benchSize file and opens it over FUSE; it returns
// the rig, the node, the handle and the host path.
func benchOpen(b *testing.B) (*rig, uint64, uint64, string) {
	r := newRig(b, Options{})
	dir := r.export(b, "e", false, map[string]string{"f": string(make([]byte, benchSize))})
	r.initSession(b)
	node := r.walk(b, "e", "f")
	fh, errno := r.open(b, node, syscall.O_RDWR)
	require.Zero(b, errno)
	return r, node, fh, filepath.Join(dir, "f")
}

// pageBuffers returns benchPages page-sized buffers.
func pageBuffers() [][]byte {
	bufs := make([][]byte, benchPages)
	for i := range bufs {
		bufs[i] = make([]byte, benchPage)
	}
	return bufs
}

func BenchmarkRead1MiB(b *testing.B) {
	b.Run("device", func(b *testing.B) {
		r, node, fh, _ := benchOpen(b)
		msg, _ := r.encode(opRead, node, &readIn{Fh: fh, Size: benchSize})
		descs := []virtiotest.Descriptor{r.place(b, msg, 0), r.place(b, nil, outHeaderSize)}
		for range benchPages {
			descs = append(descs, r.place(b, nil, benchPage))
		}
		resend := r.fixedChain(b, descs)
		b.SetBytes(benchSize)
		for b.Loop() {
			if n := resend(); n != outHeaderSize+benchSize {
				b.Fatalf("READ returned %d bytes, want %d", n, outHeaderSize+benchSize)
			}
		}
	})
	b.Run("bare", func(b *testing.B) {
		_, _, _, path := benchOpen(b)
		f, err := os.Open(path)
		require.NoError(b, err)
		defer f.Close()
		bufs := pageBuffers()
		b.SetBytes(benchSize)
		for b.Loop() {
			if n, err := unix.Preadv(int(f.Fd()), bufs, 0); err != nil || n != benchSize {
				b.Fatalf("preadv: %d, %v", n, err)
			}
		}
	})
}

func BenchmarkWrite1MiB(b *testing.B) {
	page := make([]byte, benchPage)
	b.Run("device", func(b *testing.B) {
		r, node, fh, _ := benchOpen(b)
		msg, _ := r.encode(opWrite, node, &writeIn{Fh: fh, Size: benchSize})
		descs := []virtiotest.Descriptor{r.place(b, msg, 0)}
		for range benchPages {
			descs = append(descs, r.place(b, page, 0))
		}
		const replySize = outHeaderSize + 8 // fuse.WriteOut
		resend := r.fixedChain(b, append(descs, r.place(b, nil, replySize)))
		b.SetBytes(benchSize)
		for b.Loop() {
			if n := resend(); n != replySize {
				b.Fatalf("WRITE replied %d bytes, want %d", n, replySize)
			}
		}
	})
	b.Run("bare", func(b *testing.B) {
		_, _, _, path := benchOpen(b)
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		require.NoError(b, err)
		defer f.Close()
		bufs := pageBuffers()
		b.SetBytes(benchSize)
		for b.Loop() {
			if n, err := unix.Pwritev(int(f.Fd()), bufs, 0); err != nil || n != benchSize {
				b.Fatalf("pwritev: %d, %v", n, err)
			}
		}
	})
}

// place puts data (readable) or writable bytes of room in guest memory and
// returns its descriptor.
func (r *rig) place(b *testing.B, data []byte, writable uint32) virtiotest.Descriptor {
	size := uint32(len(data)) + writable
	addr, err := r.drv.Alloc(uint64(size), 8)
	require.NoError(b, err)
	if writable > 0 {
		return virtiotest.Descriptor{Addr: addr, Len: size, Flags: virtio.DescFlagWrite}
	}
	require.NoError(b, r.drv.Mem.WriteAt(data, addr))
	return virtiotest.Descriptor{Addr: addr, Len: size}
}

// fixedChain writes descs as an indirect table behind ring descriptor 0
// and returns a function that makes it available, waits for the device
// and returns the used length.
func (r *rig) fixedChain(b *testing.B, descs []virtiotest.Descriptor) func() uint32 {
	for i := range descs[:len(descs)-1] {
		descs[i].Flags |= virtio.DescFlagNext
		descs[i].Next = uint16(i + 1)
	}
	size := uint64(virtio.DescriptorSize * len(descs))
	table, err := r.drv.Alloc(size, 16)
	require.NoError(b, err)
	q := r.drv.Queue(requestQueue)
	require.NoError(b, q.WriteTable(table, descs))
	require.NoError(b, q.WriteDescriptor(0, virtiotest.Descriptor{Addr: table, Len: uint32(size), Flags: virtio.DescFlagIndirect}))
	return func() uint32 {
		require.NoError(b, q.PublishHead(0))
		q.Kick()
		u, err := q.Wait(waitLimit)
		require.NoError(b, err)
		return u.Len
	}
}
