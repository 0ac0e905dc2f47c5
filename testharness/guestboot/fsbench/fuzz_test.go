package fsbench

import "testing"

// FuzzParseLine: the line comes from a guest's console, so any text must
// parse or fail cleanly, and what parses must format back to itself.
func FuzzParseLine(f *testing.F) {
	f.Add(Marker + " workload=seq bytes=67108864 read_ns=750000000 write_ns=1500000000")
	f.Add(Marker + ` workload=python error="exec: no such file"`)
	f.Add("guest: " + Marker + ` workload=git skip=""`)
	f.Fuzz(func(t *testing.T, line string) {
		r, ok, err := ParseLine(line)
		if !ok || err != nil {
			return
		}
		again, ok, err := ParseLine(r.Line())
		if !ok || err != nil || again.Fields() != r.Fields() {
			t.Fatalf("%q parsed as %+v, which formats as %q and parses back as %+v (%v, %v)", line, r, r.Line(), again, ok, err)
		}
	})
}

// FuzzParseCmdline: a valid configuration formats back to itself.
func FuzzParseCmdline(f *testing.F) {
	f.Add("console=ttyS0 " + sampleConfig().Cmdline())
	f.Add(KeyWorkloads + "=seq " + KeyData + "=9p:t:a,b:: " + KeyMiB + "=-1")
	f.Fuzz(func(t *testing.T, cmdline string) {
		c, ok, err := ParseCmdline(cmdline)
		if !ok || err != nil {
			return
		}
		again, ok, err := ParseCmdline(c.Cmdline())
		if !ok || err != nil || again.Cmdline() != c.Cmdline() {
			t.Fatalf("%q parsed as %+v, which formats as %q and parses back as %+v (%v, %v)", cmdline, c, c.Cmdline(), again, ok, err)
		}
	})
}
