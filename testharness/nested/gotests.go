package nested

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// RunGoTests compiles the tests of every package of pkgs for arch and runs
// them, one after the other, in one boot of that harness's outer guest
// (each in its source directory, for its testdata), failing t if any
// fails there: a package's unit tests on another architecture's kernel
// (arm64: its system calls, seccomp's audit arch, KVM's arm64 API) for one
// outer boot. args are added to each test binary's flags (e.g.
// "-test.short"). It skips t when the harness is unavailable.
func RunGoTests(t testing.TB, arch string, pkgs []string, timeout time.Duration, args ...string) Result {
	t.Helper()
	arch = requireArch(t, arch)
	payload := t.TempDir()
	var script strings.Builder
	script.WriteString("rc=0\n")
	var shares []string
	for i, pkg := range pkgs {
		bin := fmt.Sprintf("pkg%d.test", i)
		buildTests(t, pkg, arch, filepath.Join(payload, bin))
		dir, pkgShares := goTestDir(pkg, arch)
		for _, s := range pkgShares {
			if !slices.Contains(shares, s) {
				shares = append(shares, s)
			}
		}
		flags := append([]string{"-test.count=1", "-test.timeout=" + cmp.Or(timeout, DefaultTimeout).String()}, args...)
		fmt.Fprintf(&script, "cd %s && { %s/%s %s && echo %q || { echo %q; rc=1; }; }\n",
			shellQuote(dir), job.PayloadDir, bin, strings.Join(flags, " "), "PACKAGE-OK "+pkg, "PACKAGE-FAIL "+pkg)
	}
	script.WriteString("exit $rc\n")
	gt := GoTest{Arch: arch, Pkg: strings.Join(pkgs, " "), Timeout: timeout}
	res, err := runBuiltTests(t, gt, arch, payload, []string{"/bin/sh", "-c", script.String()}, job.PayloadDir, shares)
	if err != nil {
		t.Fatalf("nested %s run of %d packages: %v", arch, len(pkgs), err)
	}
	for _, pkg := range pkgs {
		if !strings.Contains(res.Output, "PACKAGE-OK "+pkg) {
			t.Errorf("the tests of %s failed (or never ran) inside the nested %s guest", pkg, arch)
		}
	}
	return res
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
