package nested

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/nested/job"
)

// GoTest describes a package's tests to run inside the outer guest.
type GoTest struct {
	// Pkg is an import path or a ./relative package pattern naming one package.
	Pkg string
	// Run is the -test.run pattern; empty runs every test.
	Run string
	// Args are extra test-binary flags (e.g. "-test.bench=.").
	Args []string
	// Files, Env, MemMiB, CPUs and Timeout are as in Options.
	Files   map[string]string
	Env     []string
	MemMiB  int
	CPUs    int
	Timeout time.Duration
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
	if err := Available(); err != nil {
		t.Skipf("nested harness unavailable: %v", err)
	}
	payload := t.TempDir()
	bin := filepath.Join(payload, "pkg.test")
	build := exec.Command("go", "test", "-c", "-o", bin, gt.Pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the tests of %s: %v\n%s", gt.Pkg, err, out)
	}
	// Run in the package's source directory (visible read-only through the
	// host root) so tests find their testdata.
	dir, shares := "/payload", []string(nil)
	if out, err := exec.Command("go", "list", "-f", "{{.Dir}}\t{{.Module.Dir}}", gt.Pkg).Output(); err == nil {
		pkgDir, modDir, _ := strings.Cut(strings.TrimSpace(string(out)), "\t")
		dir = pkgDir
		// A clone under /tmp (or /root, /run) is not in the outer guest's
		// root: share the module there.
		if job.HiddenInGuest(modDir) {
			shares = []string{modDir}
		}
	}
	args := []string{"/payload/pkg.test", "-test.v", "-test.count=1"}
	if gt.Run != "" {
		args = append(args, "-test.run", gt.Run)
	}
	args = append(args, gt.Args...)
	ctx := context.Background()
	if deadline, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if d, ok := deadline.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, d.Add(-10*time.Second))
			defer cancel()
		}
	}
	res, err := Run(ctx, Options{
		PayloadDir: payload,
		Files:      gt.Files,
		Cmd:        args,
		Env:        append(gt.Env, LedgerEnv+"="+filepath.Join(job.PayloadDir, payloadLedger)),
		Dir:        dir,
		Shares:     shares,
		MemMiB:     gt.MemMiB,
		CPUs:       gt.CPUs,
		Timeout:    gt.Timeout,
		Stdout:     &lineLogger{t: t},
	})
	if err != nil {
		t.Fatalf("nested run of %s: %v", gt.Pkg, err)
	}
	if err := mergeNestedLedger(payload); err != nil {
		t.Errorf("nested run of %s: %v", gt.Pkg, err)
	}
	t.Logf("nested run of %s: exit %d, wall %v, outer /init after %v wall (%v guest uptime)", gt.Pkg, res.ExitCode, res.Wall.Round(time.Millisecond), res.InitWall.Round(time.Millisecond), res.InitUptime)
	if strings.Contains(res.Output, "testing: warning: no tests to run") {
		t.Errorf("no test of %s matches %q inside the nested guest", gt.Pkg, gt.Run)
	}
	if res.ExitCode != 0 {
		t.Errorf("tests of %s failed inside the nested guest (exit %d)", gt.Pkg, res.ExitCode)
	}
	return res
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
		l.t.Log("guest: " + strings.TrimRight(line, "\r\n"))
	}
}
