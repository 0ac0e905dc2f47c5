package vmm

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Writing a snapshot of mostly untouched RAM, sparse (pagemap) against
// plain (every page read), in ns/op and minor faults/op: fresh RAM each
// op, anonymous in 4 KiB pages (64 pages touched per 256 MiB) or mapped
// from an image with 1/16 of it data (a guest restored from a snapshot).
func BenchmarkWriteSnapshotSparse(b *testing.B) { benchWriteSnapshot(b, false) }
func BenchmarkWriteSnapshotPlain(b *testing.B)  { benchWriteSnapshot(b, true) }

func benchWriteSnapshot(b *testing.B, plain bool) {
	for _, c := range []struct {
		name  string
		size  uint64
		image bool
	}{{"anon-256MiB", 256 << 20, false}, {"anon-1GiB", 1 << 30, false}, {"image-256MiB", 256 << 20, true}} {
		b.Run(c.name, func(b *testing.B) {
			newRAM := func() *Memory { return untouchedRAM(b, c.size) }
			if c.image {
				img := benchImage(b, int64(c.size))
				newRAM = func() *Memory {
					m, err := NewMemoryFromImage([]MemoryRegion{{GPA: 0, Size: c.size}}, MemoryImage{FD: int(img.Fd())})
					require.NoError(b, err)
					return m
				}
			}
			out, err := os.Create(filepath.Join(b.TempDir(), "snap"))
			require.NoError(b, err)
			defer out.Close()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var faults int64
			for b.Loop() {
				b.StopTimer()
				m := newRAM()
				require.NoError(b, out.Truncate(0))
				_, err := out.Seek(0, io.SeekStart)
				require.NoError(b, err)
				before := minorFaults(b)
				b.StartTimer()
				require.NoError(b, writeMemorySnapshot(out, m, plain))
				b.StopTimer()
				faults += minorFaults(b) - before
				m.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(faults)/float64(b.N), "faults/op")
		})
	}
}

// benchImage is a memory image of size bytes whose every 16th MiB is
// data, the rest a hole.
func benchImage(b *testing.B, size int64) *os.File {
	f, err := os.Create(filepath.Join(b.TempDir(), "image"))
	require.NoError(b, err)
	b.Cleanup(func() { f.Close() })
	require.NoError(b, f.Truncate(size))
	data := bytes.Repeat([]byte{0x5a}, 1<<20)
	for off := int64(0); off < size; off += 16 << 20 {
		_, err := f.WriteAt(data, off)
		require.NoError(b, err)
	}
	require.NoError(b, unix.Fsync(int(f.Fd())))
	return f
}
