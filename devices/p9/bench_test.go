package p9

import (
	"bytes"
	"testing"

	p9lib "github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/require"
)

const (
	benchFileSize = 4 << 20
	benchChunk    = 32 << 10
)

// benchFile makes a device, a client and an open file of benchFileSize.
func benchFile(b *testing.B) p9lib.File {
	r := newRig(b, Options{})
	r.export(b, "s", false, map[string]string{"data": string(bytes.Repeat([]byte("x"), benchFileSize))})
	c := r.client(b)
	root, err := c.Attach("s")
	require.NoError(b, err)
	b.Cleanup(func() { _ = root.Close() })
	_, f, err := root.Walk([]string{"data"})
	require.NoError(b, err)
	b.Cleanup(func() { _ = f.Close() })
	_, _, err = f.Open(p9lib.ReadWrite)
	require.NoError(b, err)
	return f
}

// BenchmarkSequentialRead reads a 4 MiB file in 32 KiB Tread requests
// through the device and the test driver.
func BenchmarkSequentialRead(b *testing.B) {
	f := benchFile(b)
	buf := make([]byte, benchChunk)
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		for off := int64(0); off < benchFileSize; off += benchChunk {
			if _, err := f.ReadAt(buf, off); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkSequentialWrite writes a 4 MiB file in 32 KiB Twrite requests.
func BenchmarkSequentialWrite(b *testing.B) {
	f := benchFile(b)
	buf := bytes.Repeat([]byte("y"), benchChunk)
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		for off := int64(0); off < benchFileSize; off += benchChunk {
			if _, err := f.WriteAt(buf, off); err != nil {
				b.Fatal(err)
			}
		}
	}
}
