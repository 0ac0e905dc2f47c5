package guestboot

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

// The systems the benchmark compares. File sharing: the test guest on our
// VMM with our virtio-fs device and with our virtio-9p device, and on qemu
// microvm with qemu's virtio-9p and with vhost-user-fs and virtiofsd. Block
// device: the test guest's seq and rand workloads on a raw disk (the same
// image file) with our virtio-blk device and with qemu's.
const (
	FSOursVirtioFS  = "ours-virtiofs"
	FSOursNineP     = "ours-9p"
	FSQemuNineP     = "qemu-9p"
	FSQemuVirtiofsd = "qemu-virtiofsd"
	FSOursBlk       = "ours-blk"
	FSQemuBlk       = "qemu-blk"
)

// FSSuite is a group of systems measured against one of ours: a section
// of the report.
type FSSuite struct {
	ID, Title string
	// Ours is the system the others are compared with; Short its name in
	// the comparisons ("virtio-fs speed-up").
	Ours, Short string
	// Systems, Ours first, in the order of a run.
	Systems []string
	// Sizes describes what the suite measures at s.
	Sizes func(s FSSizes) string
}

// The suites: file sharing, and the block device.
var (
	FSSuiteFS = FSSuite{ID: "fs", Title: "File sharing", Ours: FSOursVirtioFS, Short: "virtio-fs",
		Systems: []string{FSOursVirtioFS, FSOursNineP, FSQemuNineP, FSQemuVirtiofsd}, Sizes: FSSizes.String}
	FSSuiteBlk = FSSuite{ID: "blk", Title: "Block device", Ours: FSOursBlk, Short: "virtio-blk",
		Systems: []string{FSOursBlk, FSQemuBlk}, Sizes: func(s FSSizes) string {
			return fmt.Sprintf("%d run(s), %d MiB written and read on a raw %d MiB disk image, %d random 4 KiB reads", s.Runs, s.MiB, s.MiB, s.RandReads)
		}}
	FSSuites = []FSSuite{FSSuiteFS, FSSuiteBlk}
)

// FSSystems is every system, in the order of a run.
var FSSystems = slices.Concat(FSSuiteFS.Systems, FSSuiteBlk.Systems)

// IsBlk says whether system is one of the block-device suite's.
func IsBlk(system string) bool { return slices.Contains(FSSuiteBlk.Systems, system) }

// FSSystemLabel is a system's name for people.
func FSSystemLabel(id string) string {
	switch id {
	case FSOursVirtioFS:
		return "cowork-vmm virtio-fs"
	case FSOursNineP:
		return "cowork-vmm virtio-9p"
	case FSQemuNineP:
		return "qemu microvm virtio-9p"
	case FSQemuVirtiofsd:
		return "qemu microvm vhost-user-fs + virtiofsd"
	case FSOursBlk:
		return "cowork-vmm virtio-blk"
	case FSQemuBlk:
		return "qemu microvm virtio-blk"
	}
	return id
}

// EnvFSBench selects the benchmark's sizes: "full" (FSSizesFull: `make
// fs-bench`), unset or "ci" (FSSizesCI: what `make test` runs), or sizes
// of one's own, "runs=N,mib=N,rand=N,tree=DIRSxFILES" (any subset; the
// rest from FSSizesCI).
const EnvFSBench = "COWORK_VMM_FS_BENCH"

// FSSizes are the benchmark's sizes.
type FSSizes struct {
	// Runs per system (interleaved); the figures are their medians.
	Runs int
	// MiB is the seq file's size; RandReads the number of 4 KiB reads.
	MiB, RandReads int
	// Dirs × FilesPerDir is the tree walked.
	Dirs, FilesPerDir int
}

// The two size presets. Nested, every request to a file-sharing device
// costs a millisecond or more, so the CI variant is small: a few minutes
// for the four systems.
var (
	FSSizesCI   = FSSizes{Runs: 1, MiB: 8, RandReads: 200, Dirs: 4, FilesPerDir: 25}
	FSSizesFull = FSSizes{Runs: 3, MiB: 64, RandReads: 2000, Dirs: 100, FilesPerDir: 100}
)

// FSSizesFromEnv returns the sizes EnvFSBench selects.
func FSSizesFromEnv() (FSSizes, error) { return ParseFSSizes(os.Getenv(EnvFSBench)) }

// ParseFSSizes parses an EnvFSBench value.
func ParseFSSizes(v string) (FSSizes, error) {
	switch v {
	case "", "ci":
		return FSSizesCI, nil
	case "full":
		return FSSizesFull, nil
	}
	s := FSSizesCI
	for _, kv := range strings.Split(v, ",") {
		key, value, _ := strings.Cut(kv, "=")
		var err error
		switch key {
		case "runs":
			s.Runs, err = strconv.Atoi(value)
		case "mib":
			s.MiB, err = strconv.Atoi(value)
		case "rand":
			s.RandReads, err = strconv.Atoi(value)
		case "tree":
			d, f, _ := strings.Cut(value, "x")
			if s.Dirs, err = strconv.Atoi(d); err == nil {
				s.FilesPerDir, err = strconv.Atoi(f)
			}
		default:
			err = errors.New("unknown key")
		}
		if err != nil {
			return FSSizes{}, fmt.Errorf("%s=%q: %q: want \"full\", \"ci\" or runs=N,mib=N,rand=N,tree=DIRSxFILES", EnvFSBench, v, kv)
		}
	}
	if s.Runs < 1 || s.Runs > 100 {
		return FSSizes{}, fmt.Errorf("%s=%q: want 1..100 runs", EnvFSBench, v)
	}
	return s, nil
}

func (s FSSizes) String() string {
	return fmt.Sprintf("%d run(s), %d MiB file, %d random 4 KiB reads, a tree of %d×%d files", s.Runs, s.MiB, s.RandReads, s.Dirs, s.FilesPerDir)
}

// treeTime is every tree file's mtime: long before the repository's index
// is written, so git never finds an entry racily clean and reads it.
var treeTime = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// MakeTree creates dirs directories of files files each under dir
// (fsbench's names and contents), replacing what was there.
func MakeTree(dir string, dirs, files int) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for i := range dirs {
		d := filepath.Join(dir, fsbench.TreeDirName(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		for j := range files {
			p := filepath.Join(d, fsbench.TreeFileName(j))
			if err := os.WriteFile(p, fsbench.TreeFileContent(i, j), 0o644); err != nil {
				return err
			}
			if err := os.Chtimes(p, treeTime, treeTime); err != nil {
				return err
			}
		}
	}
	return nil
}

// FSResults finds testinit's results in a console transcript, up to its
// end line. It fails when the guest never got there or printed a
// malformed line.
func FSResults(console string) ([]fsbench.Result, error) {
	var out []fsbench.Result
	sc := bufio.NewScanner(strings.NewReader(console))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.HasSuffix(line, fsbench.EndMarker) {
			return out, nil
		}
		r, ok, err := fsbench.ParseLine(line)
		if !ok {
			continue
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, errors.New("the guest did not finish the benchmark (no " + strconv.Quote(fsbench.EndMarker) + " line)")
}

// CheckSeqFile checks, on the host side, that the guest's seq file has its
// size and its first and last blocks' stamps.
func CheckSeqFile(path string, mib int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if want := int64(mib) * fsbench.BlockSize; info.Size() != want {
		return fmt.Errorf("%s is %d bytes, want %d", path, info.Size(), want)
	}
	stamp := make([]byte, 8)
	for _, block := range []int{0, mib - 1} {
		if _, err := f.ReadAt(stamp, int64(block)*fsbench.BlockSize); err != nil {
			return err
		}
		if got := fsbench.BlockStamp(stamp); got != uint64(block) {
			return fmt.Errorf("%s: block %d is stamped %d", path, block, got)
		}
	}
	return nil
}

// FSFigure is one workload's result of one run on one system: what the
// host-side test prints and parses.
type FSFigure struct {
	System string
	Run    int // 1-based, in the order the runs were made
	Result fsbench.Result
}

const (
	fsFigureMarker = "FSFIGURE "
	fsSkipMarker   = "FSSKIP "
)

// FigureLine formats f as the line the host-side test parses. What
// follows " # " (the figures in people's units) is for the reader.
func (f FSFigure) FigureLine() string {
	line := fmt.Sprintf("%ssystem=%s run=%d %s", fsFigureMarker, f.System, f.Run, f.Result.Fields())
	var notes []string
	for _, m := range fsbench.Metrics {
		if d, n, ok := m.Of(f.Result); ok {
			notes = append(notes, m.ID+" "+m.Describe(d, n))
		}
	}
	if len(notes) > 0 {
		line += " # " + strings.Join(notes, "; ")
	}
	return line
}

// ParseFSFigureLine parses a FigureLine (possibly with a prefix).
func ParseFSFigureLine(line string) (FSFigure, bool) {
	i := strings.Index(line, fsFigureMarker)
	if i < 0 {
		return FSFigure{}, false
	}
	rest := line[i+len(fsFigureMarker):]
	// A quoted error or skip reason may hold " # "; such a line has no
	// comment.
	if j := strings.Index(rest, " # "); j >= 0 && !strings.Contains(rest[:j], ` error="`) && !strings.Contains(rest[:j], ` skip="`) {
		rest = rest[:j]
	}
	var f FSFigure
	for range 2 {
		field, tail, _ := strings.Cut(rest, " ")
		key, value, _ := strings.Cut(field, "=")
		switch key {
		case "system":
			if value == "" || strings.ContainsAny(value, "\"=") {
				return FSFigure{}, false
			}
			f.System = value
		case "run":
			n, err := strconv.Atoi(value)
			if err != nil || n < 1 {
				return FSFigure{}, false
			}
			f.Run = n
		default:
			return FSFigure{}, false
		}
		rest = tail
	}
	r, err := fsbench.ParseFields(rest)
	if err != nil || f.System == "" || f.Run == 0 {
		return FSFigure{}, false
	}
	f.Result = r
	return f, true
}

// FSSkipLine is the line saying a system cannot run here.
func FSSkipLine(system, reason string) string {
	return fsSkipMarker + "system=" + system + " reason=" + strconv.Quote(reason)
}

// ParseFSSkipLine parses an FSSkipLine (possibly with a prefix).
func ParseFSSkipLine(line string) (system, reason string, ok bool) {
	i := strings.Index(line, fsSkipMarker+"system=")
	if i < 0 {
		return "", "", false
	}
	rest := line[i+len(fsSkipMarker+"system="):]
	system, quoted, found := strings.Cut(rest, " reason=")
	if !found || system == "" || strings.ContainsAny(system, " \"") {
		return "", "", false
	}
	reason, err := strconv.Unquote(quoted)
	if err != nil {
		return "", "", false
	}
	return system, reason, true
}

// FSSamples are the times of every metric, by system then metric id, and
// the count each is the time of (bytes, reads, files: the same in every run).
type FSSamples struct {
	times  map[string]map[string][]time.Duration
	counts map[string]map[string]int64
}

// CollectFS gathers the metrics of figs.
func CollectFS(figs []FSFigure) FSSamples {
	s := FSSamples{times: map[string]map[string][]time.Duration{}, counts: map[string]map[string]int64{}}
	for _, f := range figs {
		for _, m := range fsbench.Metrics {
			d, n, ok := m.Of(f.Result)
			if !ok {
				continue
			}
			if s.times[f.System] == nil {
				s.times[f.System] = map[string][]time.Duration{}
				s.counts[f.System] = map[string]int64{}
			}
			s.times[f.System][m.ID] = append(s.times[f.System][m.ID], d)
			s.counts[f.System][m.ID] = n
		}
	}
	return s
}

// Systems lists the systems with a figure, in FSSystems order.
func (s FSSamples) Systems() []string {
	var out []string
	for _, system := range FSSystems {
		if len(s.times[system]) > 0 {
			out = append(out, system)
		}
	}
	return out
}

// Times are the samples of metric on system, in run order.
func (s FSSamples) Times(system, metric string) []time.Duration { return s.times[system][metric] }

// Count is what metric's time on system is the time of.
func (s FSSamples) Count(system, metric string) int64 { return s.counts[system][metric] }

// Median is the median time of metric on system.
func (s FSSamples) Median(system, metric string) (time.Duration, bool) {
	v := slices.Clone(s.times[system][metric])
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], true
	}
	return v[len(v)/2-1] + (v[len(v)/2]-v[len(v)/2-1])/2, true
}

// DescribeMedian is the median of metric on system in the metric's units
// (fsbench.Metric.Describe), and the number of runs.
func (s FSSamples) DescribeMedian(system, metric string) (string, bool) {
	m, ok := fsbench.MetricByID(metric)
	d, have := s.Median(system, metric)
	if !ok || !have {
		return "", false
	}
	return fmt.Sprintf("%s [%d run(s)]", m.Describe(d, s.Count(system, metric)), len(s.Times(system, metric))), true
}

// FSSpeedup is how many times faster a suite's system of ours (System) is
// than another of the suite on one metric: the other's median time over
// ours (above 1: ours is faster). For a throughput it is the ratio of
// throughputs, ours over the other.
type FSSpeedup struct {
	Metric, System, Versus string
	Speedup                float64
}

// Speedups returns, suite by suite, its system of ours' speed-up over
// every other system of the suite on every metric both measured.
func (s FSSamples) Speedups() []FSSpeedup {
	var out []FSSpeedup
	for _, suite := range FSSuites {
		for _, m := range fsbench.Metrics {
			ours, ok := s.Median(suite.Ours, m.ID)
			if !ok || ours <= 0 {
				continue
			}
			for _, other := range suite.Systems[1:] {
				if d, ok := s.Median(other, m.ID); ok && d > 0 {
					out = append(out, FSSpeedup{Metric: m.ID, System: suite.Ours, Versus: other, Speedup: float64(d) / float64(ours)})
				}
			}
		}
	}
	return out
}

// FSTarget is a speed-up issue #16 asks of virtio-fs.
type FSTarget struct {
	Metric, Versus string
	Min            float64
}

// FSTargets: reads at least twice qemu's virtio-9p throughput, metadata
// at least five times as fast as our virtio-9p.
var FSTargets = []FSTarget{
	{Metric: "seq_read", Versus: FSQemuNineP, Min: 2},
	{Metric: "walk_cold", Versus: FSOursNineP, Min: 5},
	{Metric: "walk_warm", Versus: FSOursNineP, Min: 5},
}

// QemuNineMachine is qemu's -M for the file-sharing runs. Without acpi=off
// microvm puts its virtio-mmio interrupts on a second IO-APIC that only its
// ACPI tables describe; our guest kernel has no ACPI, so the device's
// interrupt cannot be set up and the mount fails ("no channels
// available"). Our VMM has no ACPI either: this is the like-for-like
// machine.
const QemuNineMachine = "microvm,acpi=off"

// QemuNinePArgs are the qemu arguments exporting hostDir (read-only if
// readOnly) as a virtio-9p device (virtio-mmio on microvm) with this mount
// tag, which also names its -fsdev.
func QemuNinePArgs(hostDir, tag string, readOnly bool) ([]string, error) {
	if strings.Contains(hostDir, ",") || strings.ContainsAny(tag, ",=") {
		return nil, fmt.Errorf("qemu -fsdev cannot take %q / %q: commas separate its options", hostDir, tag)
	}
	fsdev := "local,id=" + tag + ",path=" + hostDir + ",security_model=none"
	if readOnly {
		fsdev += ",readonly=on"
	}
	return []string{"-fsdev", fsdev, "-device", "virtio-9p-device,fsdev=" + tag + ",mount_tag=" + tag}, nil
}

// QemuBlkArgs are the qemu arguments attaching the raw image as a
// virtio-blk device (virtio-mmio on microvm) whose -drive is id. The cache
// mode is our device's: it reads and writes the file through the host's
// page cache (no O_DIRECT) and a flush is fdatasync, which is qemu's
// cache=writeback; aio=threads is qemu's thread pool of preadv/pwritev, as
// ours are, where io_uring or native AIO would measure another I/O path.
func QemuBlkArgs(image, id string) ([]string, error) {
	if strings.Contains(image, ",") || strings.ContainsAny(id, ",=") {
		return nil, fmt.Errorf("qemu -drive cannot take %q / %q: commas separate its options", image, id)
	}
	return []string{"-drive", "file=" + image + ",if=none,format=raw,id=" + id + ",cache=writeback,aio=threads",
		"-device", "virtio-blk-device,drive=" + id}, nil
}
