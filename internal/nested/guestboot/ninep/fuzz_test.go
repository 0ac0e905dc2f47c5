package ninep

import (
	"testing"
)

// FuzzParseLine: the line comes from a guest's console, so any text must
// parse or fail cleanly, and what parses must format back to itself.
func FuzzParseLine(f *testing.F) {
	f.Add(Marker + " bytes=67108864 write_ns=1500000000 read_ns=750000000 msize=262144")
	f.Add(Marker + ` error="mount: no such device"`)
	f.Add("guest: " + Marker + " bytes=1")
	f.Fuzz(func(t *testing.T, line string) {
		r, ok, err := ParseLine(line)
		if !ok || err != nil {
			return
		}
		again, ok, err := ParseLine(r.Line())
		if !ok || err != nil || again != r {
			t.Fatalf("%q parsed as %+v, which formats as %q and parses back as %+v (%v, %v)", line, r, r.Line(), again, ok, err)
		}
	})
}

// FuzzParseCmdline: a valid configuration formats back to itself.
func FuzzParseCmdline(f *testing.F) {
	f.Add("console=ttyS0 " + KeyTag + "=bench " + KeyMiB + "=64 " + KeyAname + "=x")
	f.Add(KeyTag + "=a,b " + KeyMiB + "=-1")
	f.Fuzz(func(t *testing.T, cmdline string) {
		c, ok, err := ParseCmdline(cmdline)
		if !ok || err != nil {
			return
		}
		again, ok, err := ParseCmdline(c.Cmdline())
		if !ok || err != nil || again != c {
			t.Fatalf("%q parsed as %+v, which formats as %q and parses back as %+v (%v, %v)", cmdline, c, c.Cmdline(), again, ok, err)
		}
	})
}
