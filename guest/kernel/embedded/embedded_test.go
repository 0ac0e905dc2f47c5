package embedded

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func gz(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestDecompressRoundTrip(t *testing.T) {
	want := bytes.Repeat([]byte("\x7fELF kernel bytes "), 1000)
	got, err := decompress(gz(t, want))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("decompressed %d bytes, want %d", len(got), len(want))
	}
}

func TestDecompressEmptyIsNotEmbedded(t *testing.T) {
	if _, err := decompress(nil); !errors.Is(err, ErrNotEmbedded) {
		t.Fatalf("err = %v, want ErrNotEmbedded", err)
	}
}

func TestDecompressCorrupt(t *testing.T) {
	data := gz(t, []byte("some kernel"))
	data[len(data)-5] ^= 0xff // break the CRC/size trailer
	if _, err := decompress(data); err == nil {
		t.Fatal("corrupt gzip accepted")
	}
	if _, err := decompress([]byte("not gzip at all")); err == nil {
		t.Fatal("non-gzip accepted")
	}
}

// Without the embedkernel tag the binary carries no kernel.
func TestStubState(t *testing.T) {
	if Available() {
		if _, err := Kernel(); err != nil {
			t.Fatalf("embedded kernel does not decompress: %v", err)
		}
		return
	}
	if _, err := Kernel(); !errors.Is(err, ErrNotEmbedded) {
		t.Fatalf("Kernel() err = %v, want ErrNotEmbedded", err)
	}
}

func TestUnpackWritesOnceAndReuses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	want := bytes.Repeat([]byte("\x7fELF kernel bytes "), 1000)
	image := gz(t, want)
	path, err := unpack(image, dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("unpacked %d bytes (%v), want %d", len(got), err, len(want))
	}
	info, err := os.Stat(dir)
	if err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("cache directory mode %v (%v), want 0700", info.Mode(), err)
	}
	// A second start reuses the file: prove it by changing its content
	// (same size) and seeing it kept.
	marked := bytes.Clone(want)
	marked[0] = 'M'
	if err := os.WriteFile(path, marked, 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := unpack(image, dir)
	if err != nil || again != path {
		t.Fatalf("second unpack: %q, %v", again, err)
	}
	if got, _ := os.ReadFile(path); got[0] != 'M' {
		t.Fatal("a complete unpacked kernel was written again")
	}
	// A truncated file (a crash mid-write by an older build) is replaced.
	if err := os.WriteFile(path, want[:10], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := unpack(image, dir); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, want) {
		t.Fatal("a truncated unpacked kernel was kept")
	}
	// Another build's kernel gets its own file; no temporary files remain.
	other, err := unpack(gz(t, []byte("another kernel")), dir)
	if err != nil || other == path {
		t.Fatalf("another image: %q, %v", other, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("cache holds %d files, want 2: %v", len(entries), entries)
	}
}

func TestUnpackRefusesBadImages(t *testing.T) {
	dir := t.TempDir()
	if _, err := unpack(nil, dir); !errors.Is(err, ErrNotEmbedded) {
		t.Fatalf("empty: %v", err)
	}
	data := gz(t, []byte("some kernel"))
	data[len(data)-5] ^= 0xff
	if _, err := unpack(data, dir); err == nil {
		t.Fatal("corrupt gzip unpacked")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("a failed unpack left %v", entries)
	}
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := unpack(gz(t, []byte("k")), filepath.Join(blocker, "sub")); err == nil {
		t.Fatal("unpacked below a regular file")
	}
}
