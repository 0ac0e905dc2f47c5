package vm

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
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
		img, err := buildInitramfs(exe, compress)
		if err != nil {
			t.Fatal(err)
		}
		if compress {
			zr, err := gzip.NewReader(bytes.NewReader(img))
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

func TestInitramfsMissingExecutable(t *testing.T) {
	if _, err := buildInitramfs(filepath.Join(t.TempDir(), "nope"), false); err == nil {
		t.Fatal("a missing executable made an initramfs")
	}
}
