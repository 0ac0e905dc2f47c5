package vm

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

type cpioEntry struct {
	mode         uint32
	major, minor uint32
	data         []byte
}

// readNewc parses a newc archive (test helper: input is ours).
func readNewc(t *testing.T, b []byte) map[string]cpioEntry {
	t.Helper()
	out := make(map[string]cpioEntry)
	field := func(h []byte, i int) uint32 {
		v, err := strconv.ParseUint(string(h[6+8*i:6+8*i+8]), 16, 32)
		if err != nil {
			t.Fatalf("bad header field %d: %v", i, err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	off := 0
	for {
		if off+110 > len(b) {
			t.Fatalf("truncated archive at %d", off)
		}
		h := b[off : off+110]
		if string(h[:6]) != "070701" {
			t.Fatalf("bad magic %q at %d", h[:6], off)
		}
		mode, size, nameSize := field(h, 1), int(field(h, 6)), int(field(h, 11))
		name := string(b[off+110 : off+110+nameSize-1])
		off = align(off + 110 + nameSize)
		data := b[off : off+size]
		off = align(off + size)
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = cpioEntry{mode: mode, major: field(h, 9), minor: field(h, 10), data: data}
	}
}

func TestInitramfsHoldsTheExecutableAsInit(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "cowork-vmm")
	content := []byte("\x7fELF fake helper executable")
	if err := os.WriteFile(exe, content, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, compress := range []bool{false, true} {
		var img []byte
		if !compress {
			img = streamInitramfs(t, exe)
		} else {
			gz, err := buildGzipInitramfs(exe)
			if err != nil {
				t.Fatal(err)
			}
			zr, err := gzip.NewReader(bytes.NewReader(gz))
			if err != nil {
				t.Fatalf("compressed initramfs is not gzip: %v", err)
			}
			if img, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		entries := readNewc(t, img)
		init, ok := entries["init"]
		if !ok {
			t.Fatalf("no /init in %v", entries)
		}
		if !bytes.Equal(init.data, content) || init.mode != 0o100755 {
			t.Errorf("/init: mode %o, %q; want 100755 and the executable", init.mode, init.data)
		}
		console := entries["dev/console"]
		if console.mode != 0o020600 || console.major != 5 || console.minor != 1 {
			t.Errorf("/dev/console: mode %o %d:%d, want char device 5:1", console.mode, console.major, console.minor)
		}
		for _, dir := range []string{"dev", "proc", "sys", "tmp", "sessions", "usr/local/bin"} {
			if e, ok := entries[dir]; !ok || e.mode&0o170000 != 0o040000 {
				t.Errorf("%s: missing or not a directory (%o)", dir, e.mode)
			}
		}
		if entries["tmp"].mode&0o7777 != 0o1777 {
			t.Errorf("/tmp mode %o, want 1777", entries["tmp"].mode&0o7777)
		}
	}
}

// byteMemory is guest memory backed by a byte slice.
type byteMemory []byte

func (m byteMemory) WriteAt(p []byte, gpa uint64) error {
	if gpa > uint64(len(m)) || uint64(len(p)) > uint64(len(m))-gpa {
		return fmt.Errorf("write of %d bytes at %#x outside %d bytes", len(p), gpa, len(m))
	}
	copy(m[gpa:], p)
	return nil
}

// streamInitramfs streams exe's initramfs into memory as the machine
// loads it, past a guard page that must stay untouched.
func streamInitramfs(t testing.TB, exe string) []byte {
	t.Helper()
	src, err := newInitramfsSource(exe)
	if err != nil {
		t.Fatal(err)
	}
	const guard = 4096
	mem := make(byteMemory, guard+int(src.Size())+guard)
	if err := src.WriteTo(mem, guard); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem[:guard], make([]byte, guard)) || !bytes.Equal(mem[guard+int(src.Size()):], make([]byte, guard)) {
		t.Fatal("the initramfs was written outside the space it announced")
	}
	return mem[guard : guard+int(src.Size())]
}

func TestInitramfsMissingExecutable(t *testing.T) {
	if _, err := newInitramfsSource(filepath.Join(t.TempDir(), "nope")); err == nil {
		t.Fatal("a missing executable made an initramfs")
	}
	if _, err := buildGzipInitramfs(filepath.Join(t.TempDir(), "nope")); err == nil {
		t.Fatal("a missing executable made a compressed initramfs")
	}
}

func TestInitramfsRefusesAnExecutableThatGrew(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "cowork-vmm")
	if err := os.WriteFile(exe, []byte("small"), 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := newInitramfsSource(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, bytes.Repeat([]byte("bigger"), 1000), 0o755); err != nil {
		t.Fatal(err)
	}
	mem := make(byteMemory, src.Size()+8192)
	err = src.WriteTo(mem, 0)
	if err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("an executable that grew was streamed: %v", err)
	}
	if !bytes.Equal(mem[src.Size():], make([]byte, 8192)) {
		t.Fatal("the grown executable spilled past the initramfs's space")
	}
}
