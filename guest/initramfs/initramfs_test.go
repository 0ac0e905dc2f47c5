package initramfs

import (
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// parsedEntry is one newc record read back by the test's own reader.
type parsedEntry struct {
	ino, mode, nlink uint32
	rdevMajor        uint32
	rdevMinor        uint32
	name             string
	data             []byte
}

// readNewc is a strict newc reader for checking what Write produced.
func readNewc(t *testing.T, archive []byte) []parsedEntry {
	t.Helper()
	var out []parsedEntry
	off := 0
	field := func(hdr []byte, i int) uint32 {
		v, err := strconv.ParseUint(string(hdr[6+8*i:6+8*i+8]), 16, 32)
		require.NoError(t, err)
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		require.LessOrEqual(t, off+110, len(archive), "truncated header at %d", off)
		hdr := archive[off : off+110]
		require.Equal(t, "070701", string(hdr[:6]), "magic at %d", off)
		require.Zero(t, off%4, "header not 4-aligned")
		e := parsedEntry{ino: field(hdr, 0), mode: field(hdr, 1), nlink: field(hdr, 4), rdevMajor: field(hdr, 9), rdevMinor: field(hdr, 10)}
		require.Zero(t, field(hdr, 2), "uid")
		require.Zero(t, field(hdr, 3), "gid")
		require.Zero(t, field(hdr, 5), "mtime")
		size := int(field(hdr, 6))
		nameSize := int(field(hdr, 11))
		nameEnd := off + 110 + nameSize
		require.LessOrEqual(t, nameEnd, len(archive))
		require.Equal(t, byte(0), archive[nameEnd-1], "name not NUL-terminated")
		e.name = string(archive[off+110 : nameEnd-1])
		dataStart := align(nameEnd)
		require.LessOrEqual(t, dataStart+size, len(archive))
		e.data = archive[dataStart : dataStart+size]
		off = align(dataStart + size)
		if e.name == "TRAILER!!!" {
			require.Equal(t, len(archive), off, "bytes after the trailer")
			return out
		}
		out = append(out, e)
	}
}

func byName(entries []parsedEntry) map[string]parsedEntry {
	m := make(map[string]parsedEntry)
	for _, e := range entries {
		m[e.name] = e
	}
	return m
}

func TestWriteRoundTrip(t *testing.T) {
	hostFile := filepath.Join(t.TempDir(), "payload.bin")
	hostData := bytes.Repeat([]byte("0123456789abc"), 1000) // not a multiple of 4
	require.NoError(t, os.WriteFile(hostFile, hostData, 0o600))

	files := []File{
		{Path: "/init", Mode: 0o755, Data: []byte("#!/bin/sh\necho hi\n")},
		{Path: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, Major: 5, Minor: 1},
		{Path: "dev/vda", Mode: fs.ModeDevice | 0o660, Major: 254, Minor: 0},
		{Path: "usr/lib/deep/file.bin", Mode: 0o644, HostPath: hostFile},
		{Path: "bin", Mode: fs.ModeSymlink | 0o777, Target: "usr/bin"},
		{Path: "usr", Mode: fs.ModeDir | 0o700}, // explicit after an implicit one
		{Path: "tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "empty", Mode: fs.ModeSetuid | 0o755},
	}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, files))
	entries := readNewc(t, buf.Bytes())
	size, err := Size(files)
	require.NoError(t, err)
	require.Equal(t, int64(buf.Len()), size, "Size must predict Write's length exactly: the VMM reserves that much guest memory")

	var names []string
	inodes := make(map[uint32]bool)
	for _, e := range entries {
		names = append(names, e.name)
		require.False(t, inodes[e.ino], "inode %d reused", e.ino)
		inodes[e.ino] = true
	}
	// Parents come before children, in first-use order.
	require.Equal(t, []string{"init", "dev", "dev/console", "dev/vda", "usr", "usr/lib", "usr/lib/deep", "usr/lib/deep/file.bin", "bin", "tmp", "empty"}, names)

	m := byName(entries)
	require.Equal(t, uint32(0o100755), m["init"].mode)
	require.Equal(t, "#!/bin/sh\necho hi\n", string(m["init"].data))
	require.Equal(t, uint32(0o020600), m["dev/console"].mode)
	require.Equal(t, [2]uint32{5, 1}, [2]uint32{m["dev/console"].rdevMajor, m["dev/console"].rdevMinor})
	require.Equal(t, uint32(0o060660), m["dev/vda"].mode)
	require.Equal(t, uint32(254), m["dev/vda"].rdevMajor)
	require.Equal(t, uint32(0o040755), m["dev"].mode, "implicit directory")
	require.Equal(t, uint32(2), m["dev"].nlink)
	require.Equal(t, uint32(0o040700), m["usr"].mode, "explicit mode replaces the implicit one")
	require.Equal(t, hostData, m["usr/lib/deep/file.bin"].data)
	require.Equal(t, uint32(0o100644), m["usr/lib/deep/file.bin"].mode)
	require.Equal(t, uint32(0o120777), m["bin"].mode)
	require.Equal(t, "usr/bin", string(m["bin"].data))
	require.Equal(t, uint32(0o041777), m["tmp"].mode)
	require.Equal(t, uint32(0o104755), m["empty"].mode)
	require.Empty(t, m["empty"].data)
}

func TestSizeRejectsWhatWriteRejects(t *testing.T) {
	_, err := Size([]File{{Path: "init", Mode: 0o755, HostPath: filepath.Join(t.TempDir(), "missing")}})
	require.ErrorIs(t, err, fs.ErrNotExist)
	_, err = Size([]File{{Path: "../escape", Mode: 0o644}})
	require.Error(t, err)
}

func TestWriteIsDeterministic(t *testing.T) {
	files := []File{{Path: "a/b", Mode: 0o644, Data: []byte("x")}, {Path: "c", Mode: fs.ModeSymlink, Target: "a"}}
	var one, two bytes.Buffer
	require.NoError(t, Write(&one, files))
	require.NoError(t, Write(&two, files))
	require.Equal(t, one.Bytes(), two.Bytes())
}

func TestWriteGzip(t *testing.T) {
	files := []File{{Path: "init", Mode: 0o755, Data: bytes.Repeat([]byte{0x7f}, 4096)}}
	var plain, packed bytes.Buffer
	require.NoError(t, Write(&plain, files))
	require.NoError(t, WriteGzip(&packed, files, gzip.BestSpeed))
	zr, err := gzip.NewReader(&packed)
	require.NoError(t, err)
	unpacked, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.Equal(t, plain.Bytes(), unpacked)

	require.Error(t, WriteGzip(io.Discard, files, 42), "invalid level")
}

func TestWriteRejectsBadInput(t *testing.T) {
	tests := map[string][]File{
		"empty path":          {{Path: ""}},
		"root":                {{Path: "/", Mode: fs.ModeDir}},
		"dot":                 {{Path: "./"}},
		"dotdot":              {{Path: "a/../../etc/passwd"}},
		"NUL":                 {{Path: "a\x00b"}},
		"duplicate":           {{Path: "a"}, {Path: "/a"}},
		"duplicate directory": {{Path: "d", Mode: fs.ModeDir}, {Path: "d", Mode: fs.ModeDir}},
		"file as parent":      {{Path: "a"}, {Path: "a/b"}},
		"data and host path":  {{Path: "a", Data: []byte("x"), HostPath: "/etc/hostname"}},
		"symlink no target":   {{Path: "a", Mode: fs.ModeSymlink}},
		"named pipe":          {{Path: "a", Mode: fs.ModeNamedPipe}},
		"raw setuid bit":      {{Path: "a", Mode: 0o4755}},
		"missing host file":   {{Path: "a", HostPath: "/nonexistent/cowork-vmm"}},
		"host path directory": {{Path: "a", HostPath: "/"}},
	}
	for name, files := range tests {
		t.Run(name, func(t *testing.T) {
			err := Write(io.Discard, files)
			require.Error(t, err)
			require.Contains(t, err.Error(), "initramfs")
		})
	}
}

// TestCpioToolLists checks the archive against GNU cpio, when installed.
func TestCpioToolLists(t *testing.T) {
	cpioPath, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio not installed (apt-get install cpio)")
	}
	files := []File{
		{Path: "init", Mode: 0o755, Data: []byte("hello")},
		{Path: "etc/motd", Mode: 0o644, Data: []byte("odd length text")},
		{Path: "sbin", Mode: fs.ModeSymlink | 0o777, Target: "bin"},
	}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, files))
	cmd := exec.Command(cpioPath, "-t", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, []string{"init", "etc", "etc/motd", "sbin"}, strings.Fields(string(out)))
}
