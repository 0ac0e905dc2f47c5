package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// TestNestedKVMClientFlow runs the kvm backend's client flow
// (TestKVMClientFlow) and boot figure (TestKVMStartToConnected) inside the
// nested harness (qemu TCG with nested SVM gives a real /dev/kvm), with a
// static cowork-vmm built here and our guest kernel. It fails if they fail
// there and skips where this host's KVM boots Linux (they run directly), in
// -short mode, and where the harness or a guest kernel is unavailable.
func TestNestedKVMClientFlow(t *testing.T) {
	runNestedKVM(t, "^(TestKVMClientFlow|TestKVMStartToConnected)$", 15*time.Minute)
}

// TestNestedKVMEgress runs TestKVMEgressAllowedDomains (a spawn's traffic
// leaves only through its proxy, over the VM's egress vsock port, and only
// to its allowedDomains) inside the nested harness, like
// TestNestedKVMClientFlow. curl in the guest comes from the host's /usr;
// the test skips inside when it is missing.
func TestNestedKVMEgress(t *testing.T) {
	runNestedKVM(t, "^TestKVMEgressAllowedDomains$", 12*time.Minute)
}

// runNestedKVM runs the e2e tests matching run inside the nested harness
// with one outer CPU, or skips (see TestNestedKVMClientFlow). One outer
// CPU, so guests get one vCPU (the kvm backend caps vCPUs at the host's
// CPUs); the 2-vCPU question is the stress target's (make nested-stress).
// One outer CPU also runs faster here.
func runNestedKVM(t *testing.T, run string, timeout time.Duration) {
	t.Helper()
	nested.RunGoTestWith(t, nestedKVMTest(t, run, timeout, 1))
}

// nestedKVMTest describes the e2e tests matching run for the outer guest
// (cpus outer CPUs, env added), with our guest kernel and a static
// cowork-vmm in the payload; it skips t where they cannot run nested.
func nestedKVMTest(t *testing.T, run string, timeout time.Duration, cpus int, env ...string) nested.GoTest {
	t.Helper()
	nested.RequireHarness(t)
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
		bin = nested.BuildCoworkVMM(t)
	}
	return nestedE2E(run, timeout, cpus, vmlinux, bin, env)
}

// nestedE2E is the GoTest of the e2e tests matching run with kernel and a
// static cowork-vmm bin in the payload.
func nestedE2E(run string, timeout time.Duration, cpus int, kernel, bin string, env []string) nested.GoTest {
	return nested.GoTest{
		Pkg:   "github.com/cowork-vmm/cowork-vmm/e2e",
		Run:   run,
		Files: map[string]string{"vmlinux": kernel, "cowork-vmm": bin},
		Env: append([]string{
			"COWORK_VMM_E2E_BIN=/payload/cowork-vmm",
			"COWORK_VMM_KERNEL=/payload/vmlinux",
		}, env...),
		CPUs:    cpus,
		MemMiB:  3072,
		Timeout: timeout,
	}
}

// TestNestedARM64ClientFlow runs the kvm backend's client flow
// (TestKVMClientFlow: configure, startVM, isGuestConnected, spawns with
// output, stdin, kill and exit, readFile, virtio-fs mounts, stopVM) and
// its egress allowlist (TestKVMEgressAllowedDomains) inside the arm64
// harness, with an arm64 cowork-vmm built here and our arm64 guest kernel.
// It skips where the arm64 harness or the arm64 kernel is missing.
func TestNestedARM64ClientFlow(t *testing.T) {
	runNestedARM64E2E(t, "^(TestKVMClientFlow|TestKVMEgressAllowedDomains)$", nested.GoTest{})
}

// TestNestedARM64ClientFlowGICv2 is TestKVMClientFlow in the arm64
// harness whose outer guest has a GICv2, as a Raspberry Pi 4 or 5 has: the
// guest gets a GICv2, every virtio device interrupts through it, and both
// stopVMs suspend the guest with its GICv2's state, which the startVM
// between resumes.
func TestNestedARM64ClientFlowGICv2(t *testing.T) {
	runNestedARM64E2E(t, "^TestKVMClientFlow$", nested.GoTest{GICv2: true})
}

// TestNestedARM64ClientFlowPages16K is TestKVMClientFlow and
// TestKVMMemoryGivenBack in the arm64 harness whose outer kernel has 16
// KiB pages (Apple Silicon under Asahi Linux, Raspberry Pi OS on a
// Raspberry Pi 5): the VM's devices, suspend and resume, and the balloon
// giving back the guest's free 4 KiB pages in whole 16 KiB host pages. It
// skips where that kernel is not built (make kernel-outer-16k-arm64).
func TestNestedARM64ClientFlowPages16K(t *testing.T) {
	nested.RequireARM64Pages16K(t)
	res := runNestedARM64E2E(t, "^(TestKVMClientFlow|TestKVMMemoryGivenBack)$", nested.GoTest{Pages16K: true})
	figures := nested.FiguresIn(res.Output, balloonFiguresMarker)
	if len(figures) == 0 {
		t.Error("the memory figures measured nothing inside the nested guest (skipped there?)")
	}
	nested.RecordFigures(t, figures...)
}

// runNestedARM64E2E runs this package's tests matching run on the kvm
// backend in the arm64 harness, its outer guest as variant's GICv2 and
// Pages16K say.
func runNestedARM64E2E(t *testing.T, run string, variant nested.GoTest) nested.Result {
	nested.RequireARM64Harness(t)
	image, err := kernel.FindGuest(nested.ArchARM64)
	if err != nil {
		t.Skipf("no arm64 guest kernel: %v", err)
	}
	gt := nestedE2E(run, 30*time.Minute, 1, image, nested.BuildCoworkVMMArch(t, nested.ArchARM64), nil)
	gt.Arch, gt.GICv2, gt.Pages16K = nested.ArchARM64, variant.GICv2, variant.Pages16K
	res := nested.RunGoTestWith(t, gt)
	want := "interruptController=GICv3"
	if variant.GICv2 {
		want = "interruptController=GICv2"
	}
	if !t.Failed() && !strings.Contains(res.Output, want) {
		t.Errorf("the helper never logged %q: the guest had another interrupt controller", want)
	}
	return res
}

// TestStartToConnected measures what the desktop client waits for at boot:
// from the startVM call to the first isGuestConnected that answers true,
// polled every 100 ms as the desktop client does ("several times a
// second"; a faster poll takes CPU from a guest on a one-CPU host), over several boots (COWORK_VMM_E2E_BOOTS, default 5),
// and logs the median. It runs against COWORK_VMM_E2E_BACKEND like
// TestClientFlow (TestKVMStartToConnected on the kvm backend); it asserts
// only that every boot connects.
func TestStartToConnected(t *testing.T) { startToConnected(t, e2eBackend(t)) }

// TestKVMStartToConnected is TestStartToConnected on the kvm backend.
func TestKVMStartToConnected(t *testing.T) {
	startToConnected(t, kvmBackend(t, "TestNestedKVMClientFlow"))
	recordBoot(t)
}

func startToConnected(t *testing.T, backend string) {
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
