package fsbench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func sampleConfig() Config {
	return Config{
		Workloads: AllWorkloads,
		Data:      Mount{Type: TypeVirtioFS, Tag: "fsdata", Sub: "bench"},
		Root:      Mount{Type: TypeNineP, Tag: "fsroot", Aname: "root", Cache: "loose"},
		MiB:       16, RandReads: 1000, Dirs: 20, FilesPerDir: 100,
	}
}

func TestCmdlineRoundTrip(t *testing.T) {
	c := sampleConfig()
	require.NoError(t, c.Validate())
	got, ok, err := ParseCmdline("console=ttyS0 quiet " + c.Cmdline() + " reboot=t")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, c, got)

	c.Workloads = []string{WorkloadWalk}
	c.Root = Mount{}
	got, ok, err = ParseCmdline(c.Cmdline())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, c, got)
	require.NotContains(t, c.Cmdline(), KeyRoot)
}

func TestRawDiskConfig(t *testing.T) {
	c := Config{Workloads: BlockWorkloads, Data: Mount{Type: TypeBlock, Tag: "vda"}, MiB: 8, RandReads: 10, Dirs: 1, FilesPerDir: 1}
	require.NoError(t, c.Validate())
	got, ok, err := ParseCmdline(c.Cmdline())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, c, got)
	require.Contains(t, c.Cmdline(), KeyData+"=blk:vda:::")
	require.Empty(t, c.Data.Options())

	for _, w := range []string{WorkloadWalk, WorkloadGit, WorkloadPython} {
		bad := c
		bad.Workloads = []string{WorkloadSeq, w}
		bad.Root = Mount{Type: TypeNineP, Tag: "fsroot"}
		require.ErrorContains(t, bad.Validate(), "needs a file system", w)
	}
	for _, m := range []Mount{{Type: TypeBlock, Tag: "vda", Sub: "x"}, {Type: TypeBlock, Tag: "vda", Cache: "loose"}, {Type: TypeBlock, Tag: "../sda"}, {Type: TypeBlock}} {
		require.Error(t, m.Validate(), "%+v", m)
	}
}

func TestParseCmdlineModeOffAndBadValues(t *testing.T) {
	_, ok, err := ParseCmdline("console=ttyS0 " + KeyMiB + "=8")
	require.NoError(t, err)
	require.False(t, ok, "no workloads: the mode is off")

	good := sampleConfig().Cmdline()
	for _, extra := range []string{
		KeyMiB + "=lots",
		KeyMiB + "=0",
		KeyMiB + "=99999",
		KeyRand + "=-1",
		KeyTree + "=20",
		KeyTree + "=0x5",
		KeyTree + "=2000x2000",
		KeyWorkloads + "=seq,seq",
		KeyWorkloads + "=seq,fly",
		KeyWorkloads + "=",
		KeyWorkloads + "=rand",
		KeyData + "=9p:tag",
		KeyData + "=nfs:tag:::",
		KeyData + "=9p::::",
		KeyData + "=9p:t:x,cache=loose::",
		KeyData + "=9p:t::..:",
		KeyData + "=9p:t::a/b:",
		KeyData + "=virtiofs:t:aname::",
		KeyRoot + "=9p:t:a b::",
	} {
		_, ok, err := ParseCmdline(good + " " + extra)
		require.True(t, ok, extra)
		require.Error(t, err, extra)
	}
	c := sampleConfig()
	c.Root = Mount{}
	require.ErrorContains(t, c.Validate(), "root")
}

func TestMountOptions(t *testing.T) {
	require.Equal(t, NinePOptions, Mount{Type: TypeNineP, Tag: "t"}.Options())
	require.Equal(t, NinePOptions+",aname=bench,cache=loose", Mount{Type: TypeNineP, Tag: "t", Aname: "bench", Cache: "loose"}.Options())
	require.Empty(t, Mount{Type: TypeVirtioFS, Tag: "t", Sub: "bench"}.Options())
}

func TestResultLineRoundTrip(t *testing.T) {
	r := Result{Workload: WorkloadSeq, Values: map[string]int64{"bytes": 16 << 20, "write_ns": 2e9, "read_ns": 1e9}}
	line := r.Line()
	require.Equal(t, Marker+" workload=seq bytes=16777216 read_ns=1000000000 write_ns=2000000000", line)
	got, ok, err := ParseLine("[   3.1] " + line)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, r, got)

	for _, r := range []Result{
		{Workload: WorkloadPython, Err: `exec "/usr/bin/python3": no such file`},
		{Workload: WorkloadGit, Skip: "no git in the host's root"},
	} {
		got, ok, err := ParseLine(r.Line())
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, r, got)
	}
	_, ok, err = ParseLine(EndMarker)
	require.NoError(t, err)
	require.False(t, ok, "the end marker is no result")
}

func TestParseLineRejectsMalformed(t *testing.T) {
	for _, line := range []string{
		Marker + " workload=seq",                     // no figures
		Marker + " workload=seq bytes=1 bytes=2",     // duplicate
		Marker + " workload=seq bytes=-1",            // negative
		Marker + " workload=seq bytes",               // not key=value
		Marker + " workload=seq bytes=x",             // not a number
		Marker + " workload=seq Bytes=1",             // bad key
		Marker + ` workload=seq error="unterminated`, // bad quoting
		Marker + " workload=Seq bytes=1",             // bad name
	} {
		_, ok, err := ParseLine(line)
		require.True(t, ok, line)
		require.Error(t, err, line)
	}
}

func TestMetrics(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range Metrics {
		require.False(t, seen[m.ID], m.ID)
		seen[m.ID] = true
		require.Contains(t, AllWorkloads, m.Workload, m.ID)
		got, ok := MetricByID(m.ID)
		require.True(t, ok)
		require.Equal(t, m, got)
	}
	seq := Result{Workload: WorkloadSeq, Values: map[string]int64{"bytes": 64 << 20, "write_ns": 2e9, "read_ns": 1e9}}
	read, _ := MetricByID("seq_read")
	d, n, ok := read.Of(seq)
	require.True(t, ok)
	require.Equal(t, time.Second, d)
	require.Equal(t, int64(64<<20), n)
	require.Equal(t, "67.1 MB/s (64 MiB in 1s)", read.Describe(d, n))
	walk, _ := MetricByID("walk_cold")
	_, _, ok = walk.Of(seq)
	require.False(t, ok, "another workload's result")
	_, _, ok = read.Of(Result{Workload: WorkloadSeq, Err: "x"})
	require.False(t, ok, "a failed result")
	rand, _ := MetricByID("rand_read")
	require.Equal(t, "250µs per read (2000 in 500ms)", rand.Describe(500*time.Millisecond, 2000))
	require.True(t, strings.HasPrefix(walk.Describe(1500*time.Millisecond, 10000), "1.5s (10000 files)"))
}

func TestExpectedAtMatchesStampedBlocks(t *testing.T) {
	block := make([]byte, BlockSize)
	file := make([]byte, 0, 3*BlockSize)
	for i := range 3 {
		FillPattern(block)
		StampBlock(block, i)
		file = append(file, block...)
	}
	for _, off := range []int64{0, 4096, BlockSize - 4096, BlockSize - 100, BlockSize, 2*BlockSize + 12345, 3*BlockSize - 4096} {
		got := make([]byte, 4096)
		ExpectedAt(got, off)
		n := min(int64(len(got)), int64(len(file))-off)
		require.True(t, bytes.Equal(file[off:off+n], got[:n]), "offset %d", off)
	}
	require.Equal(t, uint64(2), BlockStamp(file[2*BlockSize:]))
	require.NotEqual(t, file[8:16], file[16:24], "neighbouring chunks differ")
}

func TestMarkLineRoundTrip(t *testing.T) {
	for _, begin := range []bool{true, false} {
		line := MarkLine("seq_read", begin)
		metric, gotBegin, ok := ParseMark("[   12.3] " + line + "\r")
		require.True(t, ok, line)
		require.Equal(t, "seq_read", metric)
		require.Equal(t, begin, gotBegin)
		_, ok, err := ParseLine(line)
		require.False(t, ok, "a mark is no result line")
		require.NoError(t, err)
		require.NotContains(t, line, EndMarker, "a mark does not end the benchmark")
	}
	for _, bad := range []string{
		"", MarkMarker, MarkMarker + " seq_read", MarkMarker + " seq_read start", MarkMarker + " seq read begin",
		MarkMarker + " seq_read begin extra", "TESTINIT FS workload=seq", MarkMarker + "seq_read begin",
	} {
		_, _, ok := ParseMark(bad)
		require.False(t, ok, "%q", bad)
	}
	var seen []string
	MarkFunc(func(m string, b bool) { seen = append(seen, MarkLine(m, b)) }).Mark("walk_cold", true)
	require.Equal(t, []string{MarkMarker + " walk_cold begin"}, seen)
	MarkFunc(nil).Mark("walk_cold", true) // no marks: nothing, no panic
}
