package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// TestNestedKVMClientFlow runs the client-flow test (TestClientFlow) and the
// boot figure (TestStartToConnected) against the kvm backend inside the
// nested harness (qemu TCG with nested SVM gives a real /dev/kvm): the same
// test as for the process backend, with COWORK_VMM_E2E_BACKEND=kvm, a
// static cowork-vmm built here and our guest kernel. It fails if they fail
// there and skips when the harness or a guest kernel is unavailable, or
// when /dev/kvm exists here (run them directly with
// COWORK_VMM_E2E_BACKEND=kvm; this also stops recursion in the harness).
func TestNestedKVMClientFlow(t *testing.T) {
	runNestedKVM(t, "^(TestClientFlow|TestStartToConnected)$", 15*time.Minute)
}

// TestNestedKVMEgress runs the egress test (TestEgressAllowedDomains: a
// spawn's traffic leaves only through its proxy, over the VM's egress vsock
// port, and only to its allowedDomains) against the kvm backend inside the
// nested harness, like TestNestedKVMClientFlow. curl in the guest comes
// from the host's /usr; the test skips inside when it is missing.
func TestNestedKVMEgress(t *testing.T) {
	runNestedKVM(t, "^TestEgressAllowedDomains$", 12*time.Minute)
}

// runNestedKVM runs the e2e tests matching run with
// COWORK_VMM_E2E_BACKEND=kvm inside the nested harness, or skips (see
// TestNestedKVMClientFlow).
func runNestedKVM(t *testing.T, run string, timeout time.Duration) {
	t.Helper()
	if _, err := os.Stat(kvm.DevicePath); err == nil {
		t.Skipf("%s exists here: run the tests with COWORK_VMM_E2E_BACKEND=kvm directly", kvm.DevicePath)
	}
	if testing.Short() {
		t.Skip("boots a qemu guest and VMs inside it; skipped in -short mode")
	}
	if err := nested.Available(); err != nil {
		t.Skipf("nested harness unavailable: %v", err)
	}
	// COWORK_VMM_KERNEL picks the guest kernel here too; else the build cache.
	vmlinux := os.Getenv("COWORK_VMM_KERNEL")
	if vmlinux == "" {
		var err error
		if vmlinux, err = kernel.Find(kernel.Guest); err != nil {
			t.Skipf("no guest kernel: %v", err)
		}
	}
	// COWORK_VMM_E2E_BIN here names a binary to test instead of building
	// one (e.g. `make build`'s, with its embedded kernel); it must be static.
	bin := os.Getenv("COWORK_VMM_E2E_BIN")
	if bin == "" {
		_, here, _, _ := runtime.Caller(0)
		bin = filepath.Join(t.TempDir(), "cowork-vmm")
		build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/cowork-vmm")
		build.Dir = filepath.Dir(filepath.Dir(here))
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		require.NoError(t, err, "go build: %s", out)
	}

	nested.RunGoTestWith(t, nested.GoTest{
		Pkg:   "github.com/cowork-vmm/cowork-vmm/e2e",
		Run:   run,
		Files: map[string]string{"vmlinux": vmlinux, "cowork-vmm": bin},
		Env: []string{
			"COWORK_VMM_E2E_BACKEND=kvm",
			"COWORK_VMM_E2E_BIN=/payload/cowork-vmm",
			"COWORK_VMM_KERNEL=/payload/vmlinux",
		},
		// One outer CPU, so guests get one vCPU (the kvm backend caps vCPUs
		// at the host's CPUs): 2-vCPU guests triple-fault intermittently
		// under qemu's emulated nested SVM (cause not yet known; see the
		// VM backend issue's note), and one outer CPU also runs faster here.
		CPUs:    1,
		MemMiB:  3072,
		Timeout: timeout,
	})
}

// TestStartToConnected measures what the desktop client waits for at boot:
// from the startVM call to the first isGuestConnected that answers true,
// polled every 100 ms as the desktop client does ("several times a
// second"; a faster poll takes CPU from a guest on a one-CPU host), over several boots (COWORK_VMM_E2E_BOOTS, default 5),
// and logs the median. It runs against COWORK_VMM_E2E_BACKEND like
// TestClientFlow; it asserts only that every boot connects.
func TestStartToConnected(t *testing.T) {
	backend := e2eBackend(t)
	boots := 5
	if n, err := strconv.Atoi(os.Getenv("COWORK_VMM_E2E_BOOTS")); err == nil && n > 0 {
		boots = n
	}
	h := startHelper(t, backend)
	pipe, err := protocol.DialPipe(t.Context(), h.socket)
	require.NoError(t, err)
	defer pipe.Close()
	h.pipe = pipe
	h.call("configure", map[string]any{"userDataName": "boot-figure", "userDataRoot": "/home/e2e/.config/Claude", "sessionOnly": true}, nil)

	var times []time.Duration
	for i := range boots {
		start := time.Now()
		h.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "memoryGB": 1.0, "cpuCount": 1}, nil)
		deadline := start.Add(3 * time.Minute)
		for {
			var r struct {
				Connected bool `json:"connected"`
			}
			h.call("isGuestConnected", nil, &r)
			if r.Connected {
				break
			}
			require.True(t, time.Now().Before(deadline), "boot %d: the guest never connected", i)
			time.Sleep(100 * time.Millisecond)
		}
		elapsed := time.Since(start)
		times = append(times, elapsed)
		t.Logf("boot %d: startVM → isGuestConnected true in %v", i, elapsed)
		h.call("stopVM", nil, nil)
	}
	slices.Sort(times)
	t.Logf("BOOTFIGURE backend=%s startVM_to_connected median=%v min=%v max=%v n=%d",
		backend, times[len(times)/2], times[0], times[len(times)-1], len(times))
}
