package embedded

import (
	"bytes"
	"compress/gzip"
	"errors"
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
