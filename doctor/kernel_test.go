package doctor

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
	"testing/iotest"
)

// fakeBzImage is a setup header whose kernel_version points at version.
func fakeBzImage(version string) []byte {
	img := make([]byte, 0x1000)
	copy(img[0x202:], "HdrS")
	const at = 0x300 // relative to 0x200
	binary.LittleEndian.PutUint16(img[0x20e:], at)
	copy(img[0x200+at:], version+"\x00")
	return img
}

func TestKernelVersion(t *testing.T) {
	banner := "Linux version 6.1.123-cowork (root@b) (gcc 12) #1 SMP\n"
	cases := []struct {
		name string
		img  []byte
		want string
	}{
		{"vmlinux banner early", append([]byte("\x7fELF"), banner...), "6.1.123-cowork"},
		{"banner across a chunk boundary", append(bytes.Repeat([]byte{0xaa}, kernelScanChunk+0x10000-7), banner...), "6.1.123-cowork"},
		{"banner at the very end", append(bytes.Repeat([]byte{1}, 0x20000), "Linux version 6.2.0"...), "6.2.0"},
		{"bzImage header", fakeBzImage("6.1.7 (me@box) #2 SMP"), "6.1.7"},
		{"bzImage with a pointer out of range", func() []byte {
			img := fakeBzImage("x")
			binary.LittleEndian.PutUint16(img[0x20e:], 0xfff0)
			return img
		}(), ""},
		{"nothing", bytes.Repeat([]byte("no kernel "), 1000), ""},
		{"empty", nil, ""},
		{"version capped", append([]byte("Linux version "), strings.Repeat("9", 500)...), strings.Repeat("9", maxVersionLength)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := kernelVersion(bytes.NewReader(tc.img))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("version %q, want %q", got, tc.want)
			}
			// One byte per Read must give the same answer.
			got, err = kernelVersion(iotest.OneByteReader(bytes.NewReader(tc.img)))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("one byte at a time: version %q, want %q", got, tc.want)
			}
		})
	}
}

func TestKernelVersionReadError(t *testing.T) {
	if _, err := kernelVersion(iotest.ErrReader(iotest.ErrTimeout)); err == nil {
		t.Error("read error not reported")
	}
}

// FuzzKernelVersion: any image gives a short printable version or none,
// never a panic, and the same answer however it is read.
func FuzzKernelVersion(f *testing.F) {
	f.Add([]byte("Linux version 6.1.0 (x) #1"))
	f.Add(fakeBzImage("6.1.7 (me@box) #2"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, img []byte) {
		v, err := kernelVersion(bytes.NewReader(img))
		if err != nil {
			t.Fatal(err)
		}
		if len(v) > maxVersionLength {
			t.Fatalf("version of %d bytes", len(v))
		}
		for _, ch := range []byte(v) {
			if ch <= ' ' || ch >= 0x7f {
				t.Fatalf("unprintable byte %#x in version %q", ch, v)
			}
		}
		v2, err := kernelVersion(iotest.HalfReader(bytes.NewReader(img)))
		if err != nil || v2 != v {
			t.Fatalf("half reads: %q, %v; whole: %q", v2, err, v)
		}
	})
}

func TestKernelVersionExported(t *testing.T) {
	v, err := KernelVersion(strings.NewReader("junk\x00Linux version 6.1.192 (builder@host) #1 SMP\x00more"))
	if err != nil || v != "6.1.192" {
		t.Fatalf("KernelVersion = %q, %v; want 6.1.192", v, err)
	}
}
