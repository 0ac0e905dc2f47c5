package virtiofs

import (
	"context"
	"encoding/binary"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// errorRecorder is a slog handler keeping the device's error records (a
// recovered panic, a request's goroutine gone): the device turns those
// into EIO, so only its log shows them.
type errorRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (h *errorRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h *errorRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	h.mu.Lock()
	h.msgs = append(h.msgs, b.String())
	h.mu.Unlock()
	return nil
}
func (h *errorRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorRecorder) WithGroup(string) slog.Handler      { return h }

func (h *errorRecorder) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.msgs
	h.msgs = nil
	return m
}

// Node and handle ids the raw fuzzer's device holds when fuzzing starts.
const (
	fzExport  = 2 // "e1"
	fzFile    = 3 // "e1/f"
	fzDir     = 4 // "e1/d"
	fzLink    = 5 // "e1/d/out", a symlink
	fzFileFh  = 1 // e1/f open O_RDWR
	fzDirFh   = 2 // e1/d open
	fzMaxNode = 32
	fzMaxFh   = 8
)

// rawSeeds are valid requests of every opcode the tests use, against the
// fuzzer's starting ids, plus malformed ones.
func rawSeeds() [][]byte {
	r := &rig{}
	enc := func(op uint32, node uint64, args any, tail ...[]byte) []byte {
		m, _ := r.encode(op, node, args, tail...)
		return m
	}
	two := func(a, b string) []byte { return append(cstr(a), cstr(b)...) }
	type initIn struct {
		Major, Minor, MaxReadAhead, Flags, Flags2 uint32
		Unused                                    [11]uint32
	}
	seeds := [][]byte{
		enc(opInit, 0, &initIn{Major: 7, Minor: 36, Flags: uint32(fuse.CAP_READDIRPLUS | fuse.CAP_MAX_PAGES)}),
		enc(opInit, 0, &initIn{Major: 8}),
		enc(opLookup, fuse.FUSE_ROOT_ID, nil, cstr("e1")),
		enc(opLookup, fzExport, nil, cstr("f")),
		enc(opLookup, fzExport, nil, cstr("..")),
		enc(opLookup, fzDir, nil, cstr("a/b")),
		enc(opForget, fzFile, &struct{ N uint64 }{1}),
		enc(opBatchForget, 0, &batchForgetIn{Count: 3}, le(&forgetOne{fzFile, 1}), le(&forgetOne{99, 1})),
		enc(opGetattr, fzFile, &getattrIn{}),
		enc(opSetattr, fzFile, &setattrIn{Valid: fuse.FATTR_MODE | fuse.FATTR_SIZE | fuse.FATTR_MTIME, Mode: 0o6755, Size: 3, Mtime: 1}),
		enc(opReadlink, fzFile, nil),
		enc(opReadlink, fzLink, nil),
		enc(opSymlink, fzExport, nil, two("s", "/etc/passwd")),
		enc(opMknod, fzDir, &mknodIn{Mode: syscall.S_IFIFO | 0o644}, cstr("p")),
		enc(opMknod, fzDir, &mknodIn{Mode: syscall.S_IFCHR | 0o644, Rdev: 0x103}, cstr("c")),
		enc(opMkdir, fzDir, &mkdirIn{Mode: 0o3755}, cstr("m")),
		enc(opUnlink, fzDir, nil, cstr("p")),
		enc(opRmdir, fzDir, nil, cstr("m")),
		enc(opRename, fzExport, &renameIn{Newdir: fzDir}, two("f", "f2")),
		enc(opRename, fzDir, &renameIn{Newdir: fzExport}, two("f2", "f")),
		enc(opRename2, fzExport, &rename2In{Newdir: fzExport, Flags: 1}, two("f", "g")),
		enc(opLink, fzDir, &linkIn{fzFile}, cstr("hard")),
		enc(opOpen, fzFile, &openIn{Flags: syscall.O_RDWR | syscall.O_TRUNC}),
		enc(opRead, fzFile, &readIn{Fh: fzFileFh, Size: 100}),
		enc(opRead, fzFile, &readIn{Fh: fzFileFh, Offset: 1 << 63, Size: 1 << 31}),
		enc(opWrite, fzFile, &writeIn{Fh: fzFileFh, Size: 3}, []byte("abc")),
		enc(opWrite, fzFile, &writeIn{Fh: fzFileFh, Offset: 1<<63 - 2, Size: 3}, []byte("abc")),
		enc(opStatfs, fzExport, nil),
		enc(opRelease, fzFile, &releaseIn{Fh: fzFileFh}),
		enc(opFsync, fzFile, &fsyncIn{Fh: fzFileFh}),
		enc(opSetxattr, fzFile, &struct{ Size, Flags, SetxattrFlags, Pad uint32 }{1, 0, 0, 0}, two("user.x", "v")),
		enc(opGetxattr, fzFile, &struct{ Size, Pad uint32 }{64, 0}, cstr("security.capability")),
		enc(opListxattr, fzFile, &struct{ Size, Pad uint32 }{0, 0}),
		enc(opRemovexattr, fzFile, nil, cstr("user.x")),
		enc(opFlush, fzFile, &flushIn{Fh: fzFileFh}),
		enc(opOpendir, fzDir, &openIn{}),
		enc(opReaddir, fzDir, &readIn{Fh: fzDirFh, Size: 4096}),
		enc(opReaddirplus, fzDir, &readIn{Fh: fzDirFh, Size: 200}),
		enc(opReleasedir, fzDir, &releaseIn{Fh: fzDirFh}),
		enc(opFsyncdir, fzDir, &fsyncIn{Fh: fzDirFh}),
		enc(opGetlk, fzFile, make([]byte, 48)),
		enc(opAccess, fzFile, &struct{ Mask, Pad uint32 }{4, 0}),
		enc(opCreate, fzDir, &createIn{Flags: syscall.O_RDWR, Mode: 0o6644}, cstr("new")),
		enc(opInterrupt, 0, &interruptIn{Unique: 5}),
		enc(opDestroy, 0, nil),
		enc(opFallocate, fzFile, make([]byte, 32)),
		enc(opLseek, fzFile, make([]byte, 24)),
		enc(opCopyFileRange, fzFile, make([]byte, 56)),
		enc(opIoctl, fzFile, make([]byte, 32)),
		enc(opPoll, fzFile, make([]byte, 24)),
		enc(opNotifyReply, fzFile, make([]byte, 40), []byte("data")),
		enc(opSyncfs, fzFile, make([]byte, 8)),
		enc(opTmpfile, fzDir, &createIn{Flags: syscall.O_RDWR, Mode: 0o644}, cstr("/")),
		enc(999, fzFile, nil),
		{40, 0, 0, 0, 1, 0, 0, 0}, // a header cut short
		{},
	}
	return seeds
}

// FuzzRawChain feeds arbitrary bytes as one request chain, split across
// up to four readable buffers at fuzzed places and with up to four
// writable buffers of fuzzed (odd) sizes, to a device over a small
// read-write export after a valid INIT. The device's tables are small, so
// the fuzzer reaches ENFILE.
//
// Invariants: every chain is answered (no hang) and nothing panics (the
// device's error log stays empty: it turns a panic into EIO); a reply fits
// the writable room, is empty only when the request has no reply (FORGET,
// BATCH_FORGET, NOTIFY_REPLY, a successful INTERRUPT) or no header fits,
// and is otherwise a header whose length is the used length, whose unique
// is the request's and whose error is 0 or a negative errno; a request too
// short for a header gets an EIO header; the tables stay bounded; nothing
// beside the export changes.
func FuzzRawChain(f *testing.F) {
	for i, s := range rawSeeds() {
		f.Add(s, uint32(i*0x9E3779B9), uint32(4096+i*37))
	}
	seedFor := func(op uint32, node uint64) []byte {
		for _, s := range rawSeeds() {
			if len(s) >= 24 && binary.LittleEndian.Uint32(s[4:]) == op && binary.LittleEndian.Uint64(s[16:]) == node {
				return s
			}
		}
		panic("no seed")
	}
	f.Add(seedFor(opLookup, fzExport), uint32(0xc1_28_10_03), uint32(0xc0_03_00_90)) // split in four, reply in 3-byte and larger pieces
	f.Add(seedFor(opOpen, fzFile), uint32(0x82_30_28_01), uint32(0x80_0b_00_30))
	f.Add(seedFor(opReadlink, fzLink), uint32(0), uint32(20)) // less room than the link's target

	rec := &errorRecorder{}
	r := newRig(f, Options{MaxNodes: fzMaxNode, MaxHandles: fzMaxFh, Logger: slog.New(rec)})
	outside := filepath.Join(r.dir, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("top secret"), 0o600); err != nil {
		f.Fatal(err)
	}
	dir := r.export(f, "e1", false, map[string]string{"f": "content", "d/g": "more"})
	if err := os.Symlink("../outside/secret", filepath.Join(dir, "d", "out")); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		// Whatever modes the fuzzer set, let the temp dir go.
		_ = filepath.WalkDir(r.dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type()&fs.ModeSymlink == 0 {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	r.initSession(f)
	r.walk(f, "e1", "f")
	r.walk(f, "e1", "d")
	r.walk(f, "e1", "d", "out")
	if fh, errno := r.open(f, fzFile, syscall.O_RDWR); errno != 0 || fh != fzFileFh {
		f.Fatalf("open: %v %d", errno, fh)
	}
	if o, errno := r.opendir(f, fzDir); errno != 0 || o.Fh != fzDirFh {
		f.Fatalf("opendir: %v %d", errno, o.Fh)
	}
	if msgs := rec.take(); len(msgs) > 0 {
		f.Fatalf("errors while setting up: %q", msgs)
	}
	outsideNames := func() []string {
		ents, _ := os.ReadDir(r.dir)
		var n []string
		for _, e := range ents {
			n = append(n, e.Name())
		}
		sort.Strings(n)
		return n
	}
	wantNames := outsideNames()

	f.Fuzz(func(t *testing.T, msg []byte, cuts, room uint32) {
		if len(msg) == 0 || len(msg) > 64<<10 {
			return // the driver cannot place an empty buffer; cap the size
		}
		// Readable buffers: 1..4 pieces cut at the fuzzed places.
		var bufs []virtiotest.Buffer
		pieces := 1 + int(cuts>>30)
		prev := 0
		for i := 1; i < pieces; i++ {
			at := int(uint64(byte(cuts>>(8*(i-1)))) * uint64(len(msg)) / 256)
			if at > prev && at < len(msg) {
				bufs = append(bufs, virtiotest.Readable(msg[prev:at]))
				prev = at
			}
		}
		bufs = append(bufs, virtiotest.Readable(msg[prev:]))
		// Writable buffers: a total of up to 64 KiB in 1..4 pieces.
		total := room & 0xffff
		wpieces := 1 + int(room>>30)
		left := total
		for i := 0; i < wpieces && left > 0; i++ {
			n := left
			if i < wpieces-1 {
				n = min(left, 1+uint32(byte(room>>(16+4*i))&0xf)*uint32(1+i*i*i*17))
			}
			bufs = append(bufs, virtiotest.Writable(n))
			left -= n
		}

		op := uint32(0)
		if len(msg) >= 8 {
			op = binary.LittleEndian.Uint32(msg[4:])
		}
		q := r.drv.Queue(requestQueue)
		if op == opForget || op == opBatchForget || op == opInterrupt {
			q = r.drv.Queue(hiprioQueue)
		}
		if _, err := q.Add(bufs...); err != nil {
			t.Fatal(err)
		}
		q.Kick()
		u, err := q.Wait(10 * time.Second)
		if err != nil {
			t.Fatalf("op %d: no answer: %v", op, err)
		}
		if msgs := rec.take(); len(msgs) > 0 {
			t.Fatalf("op %d: the device logged errors: %q", op, msgs)
		}
		if u.Len > total {
			t.Fatalf("op %d: used %d > writable %d", op, u.Len, total)
		}
		noReply := op == opForget || op == opBatchForget || op == opNotifyReply || op == opInterrupt
		switch {
		case total < 16:
			if u.Len != 0 {
				t.Fatalf("op %d: a %d-byte reply in %d bytes of room", op, u.Len, total)
			}
		case len(msg) < 40:
			if !isErrorHeader(u.Data, uniqueOf(msg), syscall.EIO) {
				t.Fatalf("a %d-byte request got %x, not an EIO header", len(msg), u.Data)
			}
		case u.Len == 0:
			if !noReply {
				t.Fatalf("op %d: no reply", op)
			}
		default:
			if u.Len < 16 {
				t.Fatalf("op %d: a %d-byte reply", op, u.Len)
			}
			if got := binary.LittleEndian.Uint32(u.Data); got != u.Len {
				t.Fatalf("op %d: header length %d, used %d", op, got, u.Len)
			}
			if got := uniqueOf(u.Data); got != uniqueOf(msg) {
				t.Fatalf("op %d: unique %d, want %d", op, got, uniqueOf(msg))
			}
			if e := int32(binary.LittleEndian.Uint32(u.Data[4:])); e > 0 || e < -4095 {
				t.Fatalf("op %d: error field %d", op, e)
			}
		}
		if nodes, handles := r.dev.Counts(); nodes > fzMaxNode || handles > fzMaxFh {
			t.Fatalf("tables past their bounds: %d nodes, %d handles", nodes, handles)
		}
		if got := outsideNames(); !equalStrings(got, wantNames) {
			t.Fatalf("op %d: the directory around the export changed: %q", op, got)
		}
		if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "top secret" {
			t.Fatalf("op %d: the secret beside the export changed: %q %v", op, b, err)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 1 {
			t.Fatalf("op %d: something planted beside the export", op)
		}
	})
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
