package bench

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzProcParsers feeds arbitrary text to the /proc parsers: they must
// never panic, and what they return must be consistent.
func FuzzProcParsers(f *testing.F) {
	for _, name := range []string{"smaps", "smaps_rollup", "status", "procstat/qemu", "procstat/comm-with-parens"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("ffffffff-00000000 rw-p 0 0:0 0\nSize: 99999999999999999999 kB\n"))
	f.Fuzz(func(t *testing.T, text []byte) {
		if m, err := ParseStatus(text); err == nil && (m.RSSKiB < 0 || m.HWMKiB < 0) {
			t.Fatalf("negative memory %+v", m)
		}
		_, _ = ParseSmapsRollup(text)
		if st, err := ParseProcStat(text); err == nil && (st.PID <= 0 || st.CPU() < 0) {
			t.Fatalf("inconsistent /proc stat %+v", st)
		}
		maps, err := ParseSmaps(text)
		if err != nil {
			return
		}
		for _, m := range maps {
			if m.End < m.Start || m.SizeKiB < 0 || m.RSSKiB < 0 {
				t.Fatalf("inconsistent mapping %+v", m)
			}
		}
		if g, ok := GuestMapping(maps, 512<<20); ok && (!g.Anonymous() || g.SizeKiB < 512*1024) {
			t.Fatalf("guest mapping %+v does not fit", g)
		}
	})
}
