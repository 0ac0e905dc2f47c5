package snapshot

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeSparse is data with some of its zero blocks known: WriteSparse
// skips those (and counts the reads it does).
type fakeSparse struct {
	data  []byte
	known map[int]bool // zero blocks skipped
	read  int          // bytes written out
}

func (f *fakeSparse) Read(p []byte) (int, error) { panic("the sparse path must not Read") }

func (f *fakeSparse) WriteSparse(w io.Writer, skip func(int64) error) (int64, error) {
	var n int64
	for off := 0; off < len(f.data); off += BlockSize {
		end := min(off+BlockSize, len(f.data))
		if f.known[off/BlockSize] && end-off == BlockSize {
			if err := skip(BlockSize); err != nil {
				return n, err
			}
		} else {
			if _, err := w.Write(f.data[off:end]); err != nil {
				return n, err
			}
			f.read += end - off
		}
		n += int64(end - off)
	}
	return n, nil
}

// sparseData is 40 blocks and a tail: data in some, zeros in others,
// most zero blocks known (one zero block written out).
func sparseData() ([]byte, map[int]bool) {
	data := make([]byte, 40*BlockSize+100)
	known := map[int]bool{}
	for b := 0; b < 40; b++ {
		switch {
		case b%7 == 3:
			copy(data[b*BlockSize+b:], "data in this block")
		case b == 20: // zero, but written out
		default:
			known[b] = true
		}
	}
	copy(data[40*BlockSize:], "tail")
	return data, known
}

// writeBoth writes a snapshot of sections whose second is memory, once
// as a plain reader and once as a SparseSource, to newOut's writers.
func writeBoth(t *testing.T, newOut func() (io.Writer, func() []byte)) (plain, sparse []byte, src *fakeSparse) {
	data, known := sparseData()
	state := []byte("state")
	w, get := newOut()
	require.NoError(t, Write(w, testID, []Section{
		{Name: "vm", Size: int64(len(state)), Data: bytes.NewReader(state)},
		{Name: "memory", Size: int64(len(data)), Data: bytes.NewReader(data)},
		{Name: "tail", Size: 3, Data: bytes.NewReader([]byte("end"))},
	}))
	plain = get()
	src = &fakeSparse{data: data, known: known}
	w, get = newOut()
	require.NoError(t, Write(w, testID, []Section{
		{Name: "vm", Size: int64(len(state)), Data: bytes.NewReader(state)},
		{Name: "memory", Size: int64(len(data)), Data: src},
		{Name: "tail", Size: 3, Data: bytes.NewReader([]byte("end"))},
	}))
	return plain, get(), src
}

// A SparseSource's skips give the same file, byte for byte and checksum,
// as its bytes copied: into a file (holes) and into a stream (zeros).
func TestSparseSourceWritesTheSameFile(t *testing.T) {
	dir := t.TempDir()
	files := 0
	toFile := func() (io.Writer, func() []byte) {
		files++
		path := filepath.Join(dir, string(rune('a'+files)))
		f, err := os.Create(path)
		require.NoError(t, err)
		return f, func() []byte {
			require.NoError(t, f.Close())
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			_, err = Open(path, testID)
			require.NoError(t, err, "the checksum holds")
			return b
		}
	}
	plain, sparse, src := writeBoth(t, toFile)
	require.Equal(t, plain, sparse)
	require.Less(t, src.read, len(src.data)/2, "known zero blocks are not read")

	toStream := func() (io.Writer, func() []byte) {
		var buf bytes.Buffer
		return struct{ io.Writer }{&buf}, buf.Bytes
	}
	plain, sparse, _ = writeBoth(t, toStream)
	require.Equal(t, plain, sparse, "a writer that cannot seek")
}

// A source that skips out of step with blocks, or gives more or fewer
// bytes than the section's size, fails the write.
func TestSparseSourceMisstepsFail(t *testing.T) {
	for name, src := range map[string]sourceFunc{
		"unaligned skip": sourceFunc(func(w io.Writer, skip func(int64) error) (int64, error) {
			w.Write([]byte("x"))
			return 1, skip(BlockSize)
		}),
		"partial block skip": sourceFunc(func(w io.Writer, skip func(int64) error) (int64, error) {
			return 100, skip(100)
		}),
		"skip past the end": sourceFunc(func(w io.Writer, skip func(int64) error) (int64, error) {
			return 3 * BlockSize, skip(3 * BlockSize)
		}),
		"too many bytes": sourceFunc(func(w io.Writer, skip func(int64) error) (int64, error) {
			n, err := w.Write(make([]byte, 2*BlockSize+1))
			return int64(n), err
		}),
		"too few bytes": sourceFunc(func(w io.Writer, skip func(int64) error) (int64, error) {
			return BlockSize, skip(BlockSize)
		}),
	} {
		err := Write(io.Discard, testID, []Section{{Name: "memory", Size: 2 * BlockSize, Data: src}})
		require.Error(t, err, name)
	}
}

type sourceFunc func(io.Writer, func(int64) error) (int64, error)

func (f sourceFunc) Read([]byte) (int, error) { return 0, io.EOF }
func (f sourceFunc) WriteSparse(w io.Writer, skip func(int64) error) (int64, error) {
	return f(w, skip)
}
