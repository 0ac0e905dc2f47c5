package snapshot

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

var testID = Identity{Build: "cowork-vmm 1.2.3 abcdef", Kernel: "sha256:0123", MemoryBytes: 1 << 30, CPUs: 2}

// writeFile writes a snapshot of id with sections (name → bytes) to a
// temporary file and returns its path.
func writeFile(t testing.TB, id Identity, names []string, data [][]byte) string {
	t.Helper()
	var secs []Section
	for i, n := range names {
		secs = append(secs, Section{Name: n, Size: int64(len(data[i])), Data: bytes.NewReader(data[i])})
	}
	path := filepath.Join(t.TempDir(), "vm.snap")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, Write(f, id, secs))
	require.NoError(t, f.Close())
	return path
}

func TestWriteThenOpenGivesEverySectionBack(t *testing.T) {
	state := []byte("vcpu and vm state")
	memory := bytes.Repeat([]byte{0xab, 0xcd}, 3*4096+17)
	path := writeFile(t, testID, []string{"vm", "memory", "empty"}, [][]byte{state, memory, nil})
	f, err := Open(path, testID)
	require.NoError(t, err)
	defer f.Close()
	require.Equal(t, testID, f.Identity)
	for name, want := range map[string][]byte{"vm": state, "memory": memory, "empty": {}} {
		r, off, ok := f.Section(name)
		require.True(t, ok, name)
		require.Zero(t, off%0x10000, "section %s at %d is not aligned to 64 KiB, the largest arm64 host page", name, off)
		got, err := io.ReadAll(r)
		require.NoError(t, err)
		require.Equal(t, want, got, name)
	}
	_, _, ok := f.Section("devices")
	require.False(t, ok)
}

// A snapshot of another build, kernel, memory size or vCPU count is
// refused as a mismatch; one of another format version too.
func TestOpenRefusesAnotherIdentity(t *testing.T) {
	path := writeFile(t, testID, []string{"vm"}, [][]byte{[]byte("x")})
	for _, other := range []Identity{
		{Build: "cowork-vmm 1.2.4", Kernel: testID.Kernel, MemoryBytes: testID.MemoryBytes, CPUs: testID.CPUs},
		{Build: testID.Build, Kernel: "sha256:9999", MemoryBytes: testID.MemoryBytes, CPUs: testID.CPUs},
		{Build: testID.Build, Kernel: testID.Kernel, MemoryBytes: 2 << 30, CPUs: testID.CPUs},
		{Build: testID.Build, Kernel: testID.Kernel, MemoryBytes: testID.MemoryBytes, CPUs: 1},
	} {
		_, err := Open(path, other)
		require.ErrorIs(t, err, ErrMismatch, "%+v", other)
	}
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	raw[8] = FormatVersion + 1
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	_, err = Open(path, testID)
	require.ErrorIs(t, err, ErrMismatch)
}

// Any flipped byte, and any cut, is refused (not a mismatch: damage).
func TestOpenRefusesADamagedFile(t *testing.T) {
	path := writeFile(t, testID, []string{"vm", "memory"}, [][]byte{[]byte("state"), bytes.Repeat([]byte{7}, 9000)})
	orig, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, at := range []int{0, 9, 13, 20, 4096, 8192 + 100, len(orig) - 1} {
		raw := bytes.Clone(orig)
		raw[at] ^= 0x40
		require.NoError(t, os.WriteFile(path, raw, 0o600))
		_, err := Open(path, testID)
		require.Error(t, err, "byte %d flipped", at)
	}
	for _, n := range []int{0, 10, 200, 4096, len(orig) - 1} {
		require.NoError(t, os.WriteFile(path, orig[:n], 0o600))
		_, err := Open(path, testID)
		require.Error(t, err, "cut to %d bytes", n)
		require.False(t, errors.Is(err, ErrMismatch), "cut to %d bytes: %v", n, err)
	}
}

func TestWriteRefusesASectionShorterThanItsSize(t *testing.T) {
	err := Write(io.Discard, testID, []Section{{Name: "memory", Size: 100, Data: bytes.NewReader(make([]byte, 10))}})
	require.Error(t, err)
}

// FuzzOpen feeds arbitrary files to Open: an error or a file whose
// sections lie inside it, never a panic or a huge allocation.
func FuzzOpen(f *testing.F) {
	var buf bytes.Buffer
	require.NoError(f, Write(&buf, testID, []Section{{Name: "vm", Size: 3, Data: bytes.NewReader([]byte("abc"))}}))
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:100])
	f.Add([]byte("CWVMSNAP\x01\x00\x00\x00\xff\xff\xff\xff"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "f")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		sf, err := Open(path, testID)
		if err != nil {
			return
		}
		defer sf.Close()
		for name := range sf.sections {
			r, _, _ := sf.Section(name)
			if r.Size() > int64(len(data)) {
				t.Fatalf("section %s of %d bytes in a %d-byte file", name, r.Size(), len(data))
			}
		}
	})
}

// Guest RAM the guest never touched is a hole in the file: a 64 MiB
// memory section with one non-zero page takes a few blocks on disk, reads
// back whole, and a byte written into a hole is caught.
func TestUntouchedMemoryIsAHole(t *testing.T) {
	memory := make([]byte, 64<<20)
	copy(memory[5<<20:], "the one page the guest wrote")
	path := writeFile(t, testID, []string{"vm", "memory"}, [][]byte{[]byte("state"), memory})
	st, err := os.Stat(path)
	require.NoError(t, err)
	if blocks := st.Sys().(*syscall.Stat_t).Blocks; blocks*512 > 1<<20 {
		t.Errorf("a 64 MiB section of one written page takes %d bytes on disk", blocks*512)
	}
	f, err := Open(path, testID)
	require.NoError(t, err)
	r, _, _ := f.Section("memory")
	got, err := io.ReadAll(r)
	require.NoError(t, err)
	require.True(t, bytes.Equal(memory, got))
	_, off, _ := f.Section("memory")
	require.NoError(t, f.Close())

	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w.WriteAt([]byte{1}, off+40<<20)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	_, err = Open(path, testID)
	require.ErrorContains(t, err, "damaged")
}

// A writer that cannot seek gets the zeros written out, and the same
// checksum: the file opens.
func TestWriteWithoutSeekingChecksTheSame(t *testing.T) {
	memory := make([]byte, 3<<20)
	memory[1<<20] = 9
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, testID, []Section{{Name: "memory", Size: int64(len(memory)), Data: bytes.NewReader(memory)}}))
	path := filepath.Join(t.TempDir(), "s")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o600))
	f, err := Open(path, testID)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// OpenVerified checks a file once and records it; a later write to the
// file makes the next open check it again, and refuse it if damaged.
func TestOpenVerifiedChecksAgainAfterAWrite(t *testing.T) {
	path := writeFile(t, testID, []string{"vm", "memory"}, [][]byte{[]byte("state"), bytes.Repeat([]byte{3}, 10000)})
	f, err := OpenVerified(path, testID)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	stamp, err := os.ReadFile(path + VerifiedSuffix)
	require.NoError(t, err)
	require.NotEmpty(t, stamp)
	f, err = OpenVerified(path, testID)
	require.NoError(t, err, "the recorded file opens again")
	_, off, _ := f.Section("memory")
	require.NoError(t, f.Close())

	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w.WriteAt([]byte{4}, off+100)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	_, err = OpenVerified(path, testID)
	require.ErrorContains(t, err, "damaged", "a write after the check is caught")

	require.NoError(t, os.WriteFile(path+VerifiedSuffix, []byte("garbage"), 0o600))
	_, err = OpenVerified(path, testID)
	require.ErrorContains(t, err, "damaged", "a marker naming another file version is not trusted")
}

// A file its writer marked as written whole opens without a checksum
// pass (a damaged byte is then not seen), until it changes: a later
// write makes OpenVerified check it again and refuse it.
func TestMarkWrittenIsTrustedUntilAChange(t *testing.T) {
	path := writeFile(t, testID, []string{"vm", "memory"}, [][]byte{[]byte("state"), bytes.Repeat([]byte{3}, 10000)})
	f, err := Open(path, testID)
	require.NoError(t, err)
	_, off, _ := f.Section("memory")
	require.NoError(t, f.Close())
	require.NoError(t, MarkWritten(path))
	f, err = OpenVerified(path, testID)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w.WriteAt([]byte{4}, off+100)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	_, err = OpenVerified(path, testID)
	require.ErrorContains(t, err, "damaged", "a write after the mark is caught")
	require.ErrorIs(t, MarkWritten(path+".missing"), os.ErrNotExist)
}
