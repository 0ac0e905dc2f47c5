package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// skipWithoutUserNamespaces skips when the process backend cannot work here.
func skipWithoutUserNamespaces(t *testing.T) {
	t.Helper()
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	if err := cmd.Run(); err != nil {
		t.Skipf("user namespaces are unavailable (%v): the process backend cannot run here", err)
	}
}

// buildHelper builds cmd/cowork-vmm (static, as the product ships).
func buildHelper(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go tool to build cmd/cowork-vmm")
	}
	bin := filepath.Join(t.TempDir(), "cowork-vmm")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/cowork-vmm")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// TestBenchProcessBackend runs the whole bench against the real binary on
// the process backend: every non-VM phase is measured in every run, the
// three reports are written and agree.
func TestBenchProcessBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the helper; skipped in -short mode")
	}
	skipWithoutUserNamespaces(t)
	bin := buildHelper(t)
	out := filepath.Join(t.TempDir(), "out")
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{Runs: 2, Out: out, Backend: "process", Binary: bin}, &progress)
	require.NoError(t, err, "progress:\n%s", progress.String())

	require.Len(t, rep.Systems, 1, "no peer for the process backend")
	ours := rep.Systems[0]
	assert.Empty(t, ours.Failures)
	for _, id := range []string{"helper_start", "start_reply", "start_to_connected", "spawn_exit", "echo_first_byte", "stop"} {
		p := ours.phase(id)
		if assert.NotNil(t, p, "phase %s measured", id) {
			assert.Len(t, p.SamplesMS, 2, id)
			assert.Positive(t, p.MinMS, id)
			assert.LessOrEqual(t, p.MinMS, p.MedianMS, id)
			assert.LessOrEqual(t, p.MedianMS, p.MaxMS, id)
		}
	}
	assert.Nil(t, ours.phase("kernel_boot"), "no kernel on the process backend")
	require.NotNil(t, ours.Memory)
	assert.Positive(t, ours.Memory.RSS.Median)
	assert.Positive(t, rep.BinaryBytes)
	assert.Equal(t, "process", rep.Backend)
	assert.Contains(t, strings.Join(rep.Notes, "\n"), "no qemu peer")

	back, err := ReadJSON(filepath.Join(out, "report.json"))
	require.NoError(t, err)
	assert.Equal(t, rep, back)
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "| spawn /bin/true → exit event |")
	svg, err := os.Open(filepath.Join(out, "report.svg"))
	require.NoError(t, err)
	defer svg.Close()
	assert.Len(t, svgBars(t, svg), len(ours.Phases))
}
