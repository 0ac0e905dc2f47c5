package fsbench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kernel command line keys of the mode (key=value words; the kernel
// ignores them, as they name no parameter it knows, and testinit reads
// them from /proc/cmdline).
const (
	// KeyWorkloads lists the workloads, comma-separated; its presence
	// selects the mode.
	KeyWorkloads = "guestboot.fs"
	// KeyData is the mount of the shared directory (Mount.Word).
	KeyData = "guestboot.fsdata"
	// KeyRoot is the mount of the host's root, read-only (Mount.Word);
	// absent: no git or python workload.
	KeyRoot = "guestboot.fsroot"
	// KeyMiB is the size of the seq file in MiB.
	KeyMiB = "guestboot.fsmib"
	// KeyRand is the number of random reads.
	KeyRand = "guestboot.fsrand"
	// KeyTree is the tree's shape, DIRSxFILES (files per directory).
	KeyTree = "guestboot.fstree"
)

// Workloads, in the order the guest runs them (rand reads seq's file).
const (
	WorkloadSeq    = "seq"
	WorkloadRand   = "rand"
	WorkloadWalk   = "walk"
	WorkloadGit    = "git"
	WorkloadPython = "python"
)

// AllWorkloads is every workload in run order.
var AllWorkloads = []string{WorkloadSeq, WorkloadRand, WorkloadWalk, WorkloadGit, WorkloadPython}

// The shared directory's layout and the programs run in the host's root.
const (
	// FileName is the seq file, in the shared directory.
	FileName = "fsbench.bin"
	// TreeDir is the tree's directory in the shared directory; a git
	// repository when the git workload runs.
	TreeDir = "tree"
	// BlockSize is the size of each seq write() and read().
	BlockSize = 1 << 20
	// RandReadSize is the size and alignment of each random read.
	RandReadSize = 4096
	// RandSeed seeds the random offsets, the same on every system.
	RandSeed = 16
	// PythonPath and GitPath are the programs, inside the host's root.
	PythonPath = "/usr/bin/python3"
	GitPath    = "/usr/bin/git"
	// GitMountPoint is the directory of the host's root over which the
	// guest binds the shared directory for git (it must exist there).
	GitMountPoint = "/mnt"
	// PythonWarmRuns is how many warm runs the python figure is the
	// median of.
	PythonWarmRuns = 3
	// NinePOptions are the 9p mount options for every 9p mount: those of
	// our guest agent (guest/agent's ninePOptions).
	NinePOptions = "trans=virtio,version=9p2000.L,msize=262144"
	// Marker starts each result line on the console; EndMarker is the
	// line after the last one.
	Marker    = "TESTINIT FS"
	EndMarker = "TESTINIT FS END"
	// MarkMarker starts the lines that bracket each metric's timed work
	// (MarkLine), so that the host can count what the VMM did for it.
	MarkMarker = "TESTINIT FSMARK"
	// MarkEmpty is the metric of an empty window, opened and closed at
	// once: what the marks themselves cost (their console output).
	MarkEmpty = "marks"
	// MarkPause is how long the guest idles after each mark, untimed, so
	// that the host samples while it does nothing: qemu's console reaches
	// the host through a pipe, a moment after the guest wrote it, and a
	// guest that went on at once would have its next steps (the next
	// mark's console output, the next workload's first requests) counted
	// in the window just ended.
	MarkPause = 50 * time.Millisecond
)

// MarkFunc is told when a metric's timed work begins and ends (nil: no
// marks).
type MarkFunc func(metric string, begin bool)

// Mark calls m, when set.
func (m MarkFunc) Mark(metric string, begin bool) {
	if m != nil {
		m(metric, begin)
	}
}

// MarkLine is the console line that says metric's work begins or ends.
func MarkLine(metric string, begin bool) string {
	edge := "end"
	if begin {
		edge = "begin"
	}
	return MarkMarker + " " + metric + " " + edge
}

// ParseMark parses a MarkLine anywhere in line (a console may prefix it),
// ok false for any other line.
func ParseMark(line string) (metric string, begin, ok bool) {
	i := strings.Index(line, MarkMarker+" ")
	if i < 0 {
		return "", false, false
	}
	fields := strings.Fields(line[i+len(MarkMarker):])
	if len(fields) != 2 || !isKey(fields[0]) || (fields[1] != "begin" && fields[1] != "end") {
		return "", false, false
	}
	return fields[0], fields[1] == "begin", true
}

// Bounds of the sizes.
const (
	MaxMiB       = 4096
	MaxRandReads = 1_000_000
	MaxTreeFiles = 1_000_000
)

// PythonArgs are python3's arguments.
var PythonArgs = []string{"-c", "import json"}

// GitArgs are git's arguments: status of the tree, comparing only what a
// file system shared from another machine keeps (mtime and size; device and
// inode numbers differ between the host and each guest mount), never
// writing the index (so every run and system sees the same repository),
// with no configuration of the host's.
var GitArgs = []string{"-c", "safe.directory=*", "-c", "core.checkStat=minimal", "-c", "core.trustctime=false",
	"--no-optional-locks", "status", "--porcelain"}

// GitEnv is git's environment.
var GitEnv = []string{"PATH=/usr/bin:/bin", "HOME=/", "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C"}

// TreeDirName and TreeFileName name the tree's entries: TreeDir/d007/f0042.
func TreeDirName(i int) string  { return fmt.Sprintf("d%03d", i) }
func TreeFileName(j int) string { return fmt.Sprintf("f%04d", j) }

// TreeFileContent is the content of one tree file.
func TreeFileContent(i, j int) []byte { return fmt.Appendf(nil, "file %d of directory %d\n", j, i) }

// Mount types. A TypeBlock "mount" is a raw virtio-blk disk, /dev/TAG,
// that the guest does not mount: the seq and rand workloads (BlockWorkloads)
// write and read the device itself, no file system between. The host makes
// the disk exactly MiB MiB, so the seq workload's read also checks that the
// device ends where the data does.
const (
	TypeNineP    = "9p"
	TypeVirtioFS = "virtiofs"
	TypeBlock    = "blk"
)

// BlockWorkloads are the workloads a TypeBlock disk runs.
var BlockWorkloads = []string{WorkloadSeq, WorkloadRand}

// Mount is one shared-file-system device as the guest mounts it, or a raw
// disk (TypeBlock).
type Mount struct {
	Type string // TypeNineP, TypeVirtioFS or TypeBlock
	Tag  string // for TypeBlock, the disk's name in /dev (vda)
	// Aname is 9p's attach name (our device's export name); empty: the
	// attach root (qemu's device ignores it).
	Aname string
	// Sub is the directory under the mount point that holds the share
	// (an export of our virtio-fs device appears as a directory of that
	// name); empty: the mount point itself.
	Sub string
	// Cache is 9p's cache mode ("loose"); empty: Linux's default (none).
	Cache string
}

// Word formats m for the command line: TYPE:TAG:ANAME:SUB:CACHE.
func (m Mount) Word() string {
	return strings.Join([]string{m.Type, m.Tag, m.Aname, m.Sub, m.Cache}, ":")
}

// ParseMount parses a Word.
func ParseMount(s string) (Mount, error) {
	f := strings.Split(s, ":")
	if len(f) != 5 {
		return Mount{}, fmt.Errorf("mount %q: want TYPE:TAG:ANAME:SUB:CACHE", s)
	}
	m := Mount{Type: f[0], Tag: f[1], Aname: f[2], Sub: f[3], Cache: f[4]}
	return m, m.Validate()
}

// Validate checks m's fields: a known type, a tag, and words that cannot
// add mount options (no commas) or leave the mount (no slashes, no dots).
func (m Mount) Validate() error {
	if m.Type != TypeNineP && m.Type != TypeVirtioFS && m.Type != TypeBlock {
		return fmt.Errorf("mount type %q: want %q, %q or %q", m.Type, TypeNineP, TypeVirtioFS, TypeBlock)
	}
	for _, w := range []struct{ name, v string }{{"tag", m.Tag}, {"aname", m.Aname}, {"sub", m.Sub}, {"cache", m.Cache}} {
		if strings.ContainsAny(w.v, " ,:=/\t\n\"\\") || w.v == "." || w.v == ".." {
			return fmt.Errorf("mount %s %q: want a word without spaces, commas, colons, slashes or quotes", w.name, w.v)
		}
	}
	if m.Tag == "" {
		return errors.New("mount: no tag")
	}
	if m.Type == TypeVirtioFS && (m.Aname != "" || m.Cache != "") {
		return errors.New("mount: virtio-fs takes no attach name or 9p cache mode")
	}
	if m.Type == TypeBlock && (m.Aname != "" || m.Sub != "" || m.Cache != "") {
		return errors.New("mount: a raw disk takes no attach name, sub-directory or cache mode")
	}
	return nil
}

// Options are m's mount(2) data.
func (m Mount) Options() string {
	if m.Type != TypeNineP {
		return ""
	}
	opts := NinePOptions
	if m.Aname != "" {
		opts += ",aname=" + m.Aname
	}
	if m.Cache != "" {
		opts += ",cache=" + m.Cache
	}
	return opts
}

// Config is the mode's configuration.
type Config struct {
	Workloads []string
	Data      Mount
	// Root is the host's root, read-only; Type "" when there is none.
	Root              Mount
	MiB               int
	RandReads         int
	Dirs, FilesPerDir int
}

// Has says whether c runs workload w.
func (c Config) Has(w string) bool { return slices.Contains(c.Workloads, w) }

// Cmdline returns the kernel command line words for c.
func (c Config) Cmdline() string {
	words := []string{
		KeyWorkloads + "=" + strings.Join(c.Workloads, ","),
		KeyData + "=" + c.Data.Word(),
		KeyMiB + "=" + strconv.Itoa(c.MiB),
		KeyRand + "=" + strconv.Itoa(c.RandReads),
		KeyTree + "=" + strconv.Itoa(c.Dirs) + "x" + strconv.Itoa(c.FilesPerDir),
	}
	if c.Root.Type != "" {
		words = append(words, KeyRoot+"="+c.Root.Word())
	}
	return strings.Join(words, " ")
}

// Validate checks c: known workloads, each once; on a raw disk only
// BlockWorkloads; rand with seq; git and python with a root; sizes within
// bounds.
func (c Config) Validate() error {
	if len(c.Workloads) == 0 {
		return errors.New("fs bench: no workload")
	}
	for i, w := range c.Workloads {
		if !slices.Contains(AllWorkloads, w) {
			return fmt.Errorf("fs bench: unknown workload %q (want some of %s)", w, strings.Join(AllWorkloads, ","))
		}
		if slices.Contains(c.Workloads[:i], w) {
			return fmt.Errorf("fs bench: workload %q twice", w)
		}
	}
	if err := c.Data.Validate(); err != nil {
		return fmt.Errorf("fs bench: data %w", err)
	}
	if c.Data.Type == TypeBlock {
		for _, w := range c.Workloads {
			if !slices.Contains(BlockWorkloads, w) {
				return fmt.Errorf("fs bench: workload %q needs a file system; a raw disk runs %s", w, strings.Join(BlockWorkloads, ","))
			}
		}
	}
	if c.Root.Type != "" {
		if err := c.Root.Validate(); err != nil {
			return fmt.Errorf("fs bench: root %w", err)
		}
	} else if c.Has(WorkloadGit) || c.Has(WorkloadPython) {
		return errors.New("fs bench: the git and python workloads need the host's root (" + KeyRoot + ")")
	}
	if c.Has(WorkloadRand) && !c.Has(WorkloadSeq) {
		return errors.New("fs bench: rand reads the file seq writes")
	}
	if c.MiB < 1 || c.MiB > MaxMiB {
		return fmt.Errorf("fs bench: file size of %d MiB: want 1..%d", c.MiB, MaxMiB)
	}
	if c.RandReads < 0 || c.RandReads > MaxRandReads || (c.Has(WorkloadRand) && c.RandReads == 0) {
		return fmt.Errorf("fs bench: %d random reads: want 1..%d", c.RandReads, MaxRandReads)
	}
	if c.Dirs < 1 || c.FilesPerDir < 1 || c.Dirs > MaxTreeFiles || c.FilesPerDir > MaxTreeFiles || c.Dirs*c.FilesPerDir > MaxTreeFiles {
		return fmt.Errorf("fs bench: a tree of %d×%d files: want 1..%d files", c.Dirs, c.FilesPerDir, MaxTreeFiles)
	}
	return nil
}

// ParseCmdline reads the mode's configuration from a kernel command line.
// ok is false when the mode is off (no KeyWorkloads word); err is set when
// it is on but a value is bad.
func ParseCmdline(cmdline string) (c Config, ok bool, err error) {
	for _, word := range strings.Fields(cmdline) {
		key, value, _ := strings.Cut(word, "=")
		var perr error
		switch key {
		case KeyWorkloads:
			ok = true
			c.Workloads = nil
			if value != "" {
				c.Workloads = strings.Split(value, ",")
			}
		case KeyData:
			c.Data, perr = ParseMount(value)
		case KeyRoot:
			c.Root, perr = ParseMount(value)
		case KeyMiB:
			c.MiB, perr = atoi(key, value)
		case KeyRand:
			c.RandReads, perr = atoi(key, value)
		case KeyTree:
			d, f, found := strings.Cut(value, "x")
			if !found {
				perr = fmt.Errorf("%s=%q: want DIRSxFILES", key, value)
				break
			}
			if c.Dirs, perr = atoi(key, d); perr == nil {
				c.FilesPerDir, perr = atoi(key, f)
			}
		}
		if perr != nil && err == nil {
			err = perr
		}
	}
	if !ok {
		return Config{}, false, nil
	}
	if err != nil {
		return c, true, err
	}
	return c, true, c.Validate()
}

func atoi(key, value string) (int, error) {
	n, err := strconv.Atoi(value)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: not a number", key, value)
	}
	return n, nil
}

// Result is what the guest measured for one workload: named counts and
// times (nanoseconds, keys ending in _ns), or why it could not (Err), or
// why it did not (Skip).
type Result struct {
	Workload string
	Values   map[string]int64
	Err      string
	Skip     string
}

// Fields formats r as key=value words: workload first, then the values in
// key order, or the quoted error or skip reason.
func (r Result) Fields() string {
	var b strings.Builder
	b.WriteString("workload=" + r.Workload)
	switch {
	case r.Err != "":
		b.WriteString(" error=" + strconv.Quote(r.Err))
	case r.Skip != "":
		b.WriteString(" skip=" + strconv.Quote(r.Skip))
	default:
		keys := make([]string, 0, len(r.Values))
		for k := range r.Values {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%d", k, r.Values[k])
		}
	}
	return b.String()
}

// Line formats r as its console line.
func (r Result) Line() string { return Marker + " " + r.Fields() }

// ParseFields parses Fields' output.
func ParseFields(s string) (Result, error) {
	s = strings.TrimSpace(s)
	first, rest, _ := strings.Cut(s, " ")
	w, ok := strings.CutPrefix(first, "workload=")
	if !ok || !isKey(w) {
		return Result{}, fmt.Errorf("fs result %q: want workload=NAME first", s)
	}
	r := Result{Workload: w}
	rest = strings.TrimSpace(rest)
	for _, quoted := range []struct {
		prefix string
		dst    *string
	}{{"error=", &r.Err}, {"skip=", &r.Skip}} {
		if q, found := strings.CutPrefix(rest, quoted.prefix); found {
			msg, err := strconv.Unquote(q)
			if err != nil {
				return Result{}, fmt.Errorf("fs result %q: bad %stext: %w", s, quoted.prefix, err)
			}
			if msg == "" {
				msg = "(no reason given)"
			}
			*quoted.dst = msg
			return r, nil
		}
	}
	for _, field := range strings.Fields(rest) {
		key, value, found := strings.Cut(field, "=")
		if !found || !isKey(key) {
			return Result{}, fmt.Errorf("fs result %q: field %q is not key=value", s, field)
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 {
			return Result{}, fmt.Errorf("fs result %q: %s=%q is not a count", s, key, value)
		}
		if _, dup := r.Values[key]; dup {
			return Result{}, fmt.Errorf("fs result %q: %s twice", s, key)
		}
		if r.Values == nil {
			r.Values = map[string]int64{}
		}
		r.Values[key] = n
	}
	if len(r.Values) == 0 {
		return Result{}, fmt.Errorf("fs result %q: no figures", s)
	}
	return r, nil
}

func isKey(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// ParseLine parses a Line, possibly after other text (a console prefix).
// ok is false when line holds no result (the EndMarker is none); err when
// it holds a malformed one.
func ParseLine(line string) (r Result, ok bool, err error) {
	i := strings.Index(line, Marker+" workload=")
	if i < 0 {
		return Result{}, false, nil
	}
	r, err = ParseFields(line[i+len(Marker)+1:])
	return r, true, err
}

// Unit says how a Metric reads.
type Unit int

// Units.
const (
	// UnitTime: the time is the figure.
	UnitTime Unit = iota
	// UnitThroughput: the count is bytes; MB/s is shown beside the time.
	UnitThroughput
	// UnitPerOp: the count is operations; the time per operation is shown.
	UnitPerOp
)

// Metric is one figure of a workload's Result: a time, and the count it
// is the time of.
type Metric struct {
	ID, Label string
	Workload  string
	TimeKey   string
	CountKey  string // "" for none
	Unit      Unit
}

// Metrics is every figure reported, in workload order.
var Metrics = []Metric{
	{ID: "seq_write", Label: "sequential write + fsync", Workload: WorkloadSeq, TimeKey: "write_ns", CountKey: "bytes", Unit: UnitThroughput},
	{ID: "seq_read", Label: "sequential read, cache dropped", Workload: WorkloadSeq, TimeKey: "read_ns", CountKey: "bytes", Unit: UnitThroughput},
	{ID: "ram_read", Label: "sequential read from guest RAM: every read's ceiling", Workload: WorkloadSeq, TimeKey: "ram_read_ns", CountKey: "bytes", Unit: UnitThroughput},
	{ID: "rand_read", Label: "4 KiB random reads, cache dropped", Workload: WorkloadRand, TimeKey: "ns", CountKey: "reads", Unit: UnitPerOp},
	{ID: "walk_cold", Label: "tree walk (readdir + lstat), cold", Workload: WorkloadWalk, TimeKey: "cold_ns", CountKey: "files"},
	{ID: "walk_warm", Label: "tree walk (readdir + lstat), warm", Workload: WorkloadWalk, TimeKey: "warm_ns", CountKey: "files"},
	{ID: "git_cold", Label: "git status, cold", Workload: WorkloadGit, TimeKey: "cold_ns", CountKey: "files"},
	{ID: "git_warm", Label: "git status, warm", Workload: WorkloadGit, TimeKey: "warm_ns", CountKey: "files"},
	{ID: "python_cold", Label: "python3 -c 'import json', cold", Workload: WorkloadPython, TimeKey: "cold_ns"},
	{ID: "python_warm", Label: "python3 -c 'import json', warm", Workload: WorkloadPython, TimeKey: "warm_ns"},
}

// MetricByID returns the metric with this id.
func MetricByID(id string) (Metric, bool) {
	for _, m := range Metrics {
		if m.ID == id {
			return m, true
		}
	}
	return Metric{}, false
}

// Of returns m's time and count in r, ok false when r is another
// workload's, failed, was skipped or lacks the figure.
func (m Metric) Of(r Result) (d time.Duration, count int64, ok bool) {
	if r.Workload != m.Workload || r.Err != "" || r.Skip != "" {
		return 0, 0, false
	}
	ns, ok := r.Values[m.TimeKey]
	if !ok || ns <= 0 {
		return 0, 0, false
	}
	if m.CountKey != "" {
		count = r.Values[m.CountKey]
	}
	return time.Duration(ns), count, true
}

// Describe formats a time of m with its count: "1.23 s, 54.6 MB/s",
// "2000 reads, 312.5 µs/read", "10000 files, 1.50 s".
func (m Metric) Describe(d time.Duration, count int64) string {
	switch {
	case m.Unit == UnitThroughput && d > 0:
		return fmt.Sprintf("%.1f MB/s (%d MiB in %v)", float64(count)/d.Seconds()/1e6, count>>20, d.Round(time.Millisecond))
	case m.Unit == UnitPerOp && count > 0:
		return fmt.Sprintf("%v per read (%d in %v)", (d / time.Duration(count)).Round(100*time.Nanosecond), count, d.Round(time.Millisecond))
	case count > 0:
		return fmt.Sprintf("%v (%d %s)", d.Round(time.Millisecond), count, m.CountKey)
	}
	return d.Round(time.Millisecond).String()
}

// FillPattern fills a block with bytes that differ between neighbouring
// offsets (so a shifted or repeated chunk is caught).
func FillPattern(b []byte) {
	for i := range b {
		b[i] = patternByte(i)
	}
}

func patternByte(i int) byte { return byte(i*7 + i>>8) }

// StampBlock writes block number n at both ends of b (a whole block), so
// a block read from the wrong offset is caught.
func StampBlock(b []byte, n int) {
	binary.LittleEndian.PutUint64(b, uint64(n))
	binary.LittleEndian.PutUint64(b[len(b)-8:], ^uint64(n))
}

// BlockStamp reads the number StampBlock wrote at the start of b.
func BlockStamp(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// ExpectedAt fills b with the content of the seq file at offset off: the
// pattern of each block, with its stamps.
func ExpectedAt(b []byte, off int64) {
	var stamp [8]byte
	for i := range b {
		pos := off + int64(i)
		block, in := pos/BlockSize, int(pos%BlockSize)
		switch {
		case in < 8:
			binary.LittleEndian.PutUint64(stamp[:], uint64(block))
			b[i] = stamp[in]
		case in >= BlockSize-8:
			binary.LittleEndian.PutUint64(stamp[:], ^uint64(block))
			b[i] = stamp[in-(BlockSize-8)]
		default:
			b[i] = patternByte(in)
		}
	}
}
