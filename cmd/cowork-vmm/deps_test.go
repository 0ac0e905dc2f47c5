package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/cowork-vmm/cowork-vmm"

// harnessPackages are the import paths (and the trees under them) of the
// test harness and the benchmarks: the helper must not link them, since
// its executable is also every guest's /init.
var harnessPackages = []string{module + "/testharness", module + "/bench"}

// TestProductLinksNoHarness lists what cmd/cowork-vmm links (go list
// -deps) and fails on any package of the test harness or the benchmarks:
// qemu and virtiofsd launchers, test guests and report writers have no
// place in the helper or in the guest's /init.
func TestProductLinksNoHarness(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go tool on PATH to list cmd/cowork-vmm's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", module+"/cmd/cowork-vmm").Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
	}
	require.NoError(t, err)
	deps := strings.Fields(string(out))
	// The listing is real: it names the command itself and the helper.
	require.Contains(t, deps, module+"/cmd/cowork-vmm")
	require.Contains(t, deps, module+"/helper")
	var linked []string
	for _, dep := range deps {
		for _, h := range harnessPackages {
			if dep == h || strings.HasPrefix(dep, h+"/") {
				linked = append(linked, dep)
			}
		}
	}
	require.Empty(t, linked, "cmd/cowork-vmm links harness or benchmark packages")
}
