package nested

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// GoTest describes a package's tests to run inside the outer guest.
type GoTest struct {
	// Arch is the outer guest's (Options.Arch); the tests are built for it.
	Arch string
	// Pkg is an import path or a ./relative package pattern naming one package.
	Pkg string
	// Run is the -test.run pattern; empty runs every test.
	Run string
	// Args are extra test-binary flags (e.g. "-test.bench=.").
	Args []string
	// Files, Env, MemMiB, CPUs, Timeout and QemuLog are as in Options.
	Files   map[string]string
	Env     []string
	MemMiB  int
	CPUs    int
	Timeout time.Duration
	QemuLog string
	// SingleThreadTCG, GICv2 and Pages16K are as in Options.
	SingleThreadTCG bool
	GICv2           bool
	Pages16K        bool
	// Shares are more host directories the tests read at their own paths
	// (Options.Shares), e.g. beneath /root, which the outer guest replaces.
	Shares []string
}

// RunGoTest compiles pkg's tests (CGO_ENABLED=0), runs those matching
// runPattern verbosely inside the outer guest, streams their output to t's
// log and fails t if they fail. It skips t when the harness is unavailable.
func RunGoTest(t testing.TB, pkg, runPattern string) Result {
	t.Helper()
	return RunGoTestWith(t, GoTest{Pkg: pkg, Run: runPattern})
}

// RunGoTestWith is RunGoTest with files, flags and sizing.
func RunGoTestWith(t testing.TB, gt GoTest) Result {
	t.Helper()
	res, err := TryGoTest(t, gt)
	if err != nil {
		t.Fatalf("nested run of %s: %v", gt.Pkg, err)
	}
	if strings.Contains(res.Output, "testing: warning: no tests to run") {
		t.Errorf("no test of %s matches %q inside the nested guest", gt.Pkg, gt.Run)
	}
	if res.ExitCode != 0 {
		t.Errorf("tests of %s failed inside the nested guest (exit %d)", gt.Pkg, res.ExitCode)
	}
	return res
}

// frozenRetries is how many times RunThroughFreezes runs a run again whose
// outer guest froze.
const frozenRetries = 2

// RunThroughFreezes is Run, run again up to frozenRetries times while its
// outer guest froze (ErrOuterFroze: the emulator's doing, not the
// payload's; freeze.go). again, when set, is called before each new run
// with its number and the freeze, e.g. to say so and to drop what the
// frozen run left in the payload directory.
func RunThroughFreezes(ctx context.Context, opts Options, again func(retry, of int, froze error)) (Result, error) {
	res, err := Run(ctx, opts)
	for retry := 1; retry <= frozenRetries && errors.Is(err, ErrOuterFroze); retry++ {
		if again != nil {
			again(retry, frozenRetries, err)
		}
		res, err = Run(ctx, opts)
	}
	return res, err
}

// TryGoTest runs gt inside the outer guest like RunGoTestWith but leaves
// judging the result to the caller: an error means no result (the outer
// guest died, qemu failed). It still skips t when the harness is
// unavailable and fails it when the tests do not build.
func TryGoTest(t testing.TB, gt GoTest) (Result, error) {
	t.Helper()
	arch := requireArch(t, gt.Arch)
	payload := t.TempDir()
	buildTests(t, gt.Pkg, arch, filepath.Join(payload, "pkg.test"))
	dir, shares := goTestDir(gt.Pkg, arch)
	args := []string{"/payload/pkg.test", "-test.v", "-test.count=1"}
	if gt.Run != "" {
		args = append(args, "-test.run", gt.Run)
	}
	// A test that hangs while the outer guest lives then panics with every
	// goroutine's stack, a minute before outerinit would kill it silently.
	if budget := cmp.Or(gt.Timeout, DefaultTimeout); budget > 2*time.Minute {
		args = append(args, "-test.timeout="+(budget-time.Minute).String())
	}
	args = append(args, gt.Args...)
	return runBuiltTests(t, gt, arch, payload, args, dir, shares)
}

// runBuiltTests runs the test command cmd, built into payload, in dir of
// the outer guest of arch with shares (and gt's) visible, and merges what
// the tests recorded in the boot ledger.
func runBuiltTests(t testing.TB, gt GoTest, arch, payload string, cmd []string, dir string, shares []string) (Result, error) {
	t.Helper()
	ctx := context.Background()
	if deadline, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if d, ok := deadline.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d.Add(-10*time.Second))
			defer cancel()
		}
	}
	opts := Options{
		Arch:            arch,
		PayloadDir:      payload,
		Files:           gt.Files,
		Cmd:             cmd,
		Env:             append(gt.Env, LedgerEnv+"="+filepath.Join(job.PayloadDir, payloadLedger)),
		Dir:             dir,
		Shares:          append(shares, gt.Shares...),
		MemMiB:          gt.MemMiB,
		CPUs:            gt.CPUs,
		Timeout:         gt.Timeout,
		Stdout:          &lineLogger{t: t},
		QemuLog:         gt.QemuLog,
		SingleThreadTCG: gt.SingleThreadTCG,
		GICv2:           gt.GICv2,
		Pages16K:        gt.Pages16K,
	}
	res, err := RunThroughFreezes(ctx, opts, func(retry, of int, froze error) {
		// What the frozen run's tests recorded is dropped, as they run
		// again.
		t.Logf("nested run of %s: %v; running it again (%d of %d)", gt.Pkg, froze, retry, of)
		if rmErr := os.Remove(filepath.Join(payload, payloadLedger)); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			t.Errorf("nested run of %s: %v", gt.Pkg, rmErr)
		}
	})
	if mergeErr := mergeNestedLedger(payload, ledgerMode(arch, gt.GICv2)); mergeErr != nil {
		t.Errorf("nested run of %s: %v", gt.Pkg, mergeErr)
	}
	if err != nil {
		return res, err
	}
	t.Logf("nested %s run of %s: exit %d, wall %v, outer /init after %v wall (%v guest uptime), %s", arch, gt.Pkg, res.ExitCode, res.Wall.Round(time.Millisecond), res.InitWall.Round(time.Millisecond), res.InitUptime, res.ClockNote())
	return res, nil
}

// goTestDir is where a package's tests run in the outer guest: its source
// directory (visible read-only through the host root) so they find their
// testdata, and the directories to share for that: the module, when it
// lies where the outer guest's root hides the host's (a clone in /tmp), and
// always on arm64, whose outer guest does not see the host's root.
func goTestDir(pkg, arch string) (dir string, shares []string) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}\t{{.Module.Dir}}", pkg).Output()
	if err != nil {
		return job.PayloadDir, nil
	}
	pkgDir, modDir, _ := strings.Cut(strings.TrimSpace(string(out)), "\t")
	if modDir != "" && (arch == ArchARM64 || job.HiddenInGuest(modDir)) {
		shares = []string{modDir}
	}
	return pkgDir, shares
}

// lineLogger sends complete console lines to t.Log, which streams under -v.
type lineLogger struct {
	t   testing.TB
	buf bytes.Buffer
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.WriteString(line) // incomplete: keep for the next write
			return len(p), nil
		}
		if strings.Contains(line, job.MarkerAlive+" ") {
			continue // the heartbeat: the console tail shows the latest
		}
		l.t.Log("guest: " + strings.TrimRight(line, "\r\n"))
	}
}

// requireArch is arch normalised (normalArch), failing t on an unknown one
// and skipping it where that harness is unavailable.
func requireArch(t testing.TB, arch string) string {
	t.Helper()
	arch, err := normalArch(arch)
	if err != nil {
		t.Fatal(err)
	}
	if err := AvailableArch(arch); err != nil {
		t.Skipf("nested harness unavailable: %v", err)
	}
	return arch
}

// buildTests compiles pkg's tests for arch (static) into bin, failing t
// when they do not build.
func buildTests(t testing.TB, pkg, arch, bin string) {
	t.Helper()
	build := exec.Command("go", "test", "-c", "-o", bin, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+arch)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the tests of %s for %s: %v\n%s", pkg, arch, err, out)
	}
}
