package vm

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtiofs"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// TestBinEnv names a static cowork-vmm binary for the KVM tests: the
// guest's /init (the test binary itself is not an agent).
const TestBinEnv = "COWORK_VMM_TEST_BIN"

// requireKVMBoot skips unless a real Linux guest can boot here (the probe
// says so and a guest kernel is built) and returns the cowork-vmm binary
// that is the guest's /init: $COWORK_VMM_TEST_BIN, else one built here.
func requireKVMBoot(t *testing.T) string {
	t.Helper()
	nested.RequireLinuxBoot(t, "TestNestedKVMBackend")
	bin := os.Getenv(TestBinEnv)
	if _, err := kernel.Locate(defaultKernelSources("", bin)); err != nil {
		t.Skipf("no guest kernel: %v", err)
	}
	if bin == "" {
		bin = nested.BuildCoworkVMM(t)
	}
	return bin
}

// testLogWriter sends log lines to t.Log.
type testLogWriter struct {
	mu sync.Mutex
	t  *testing.T
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// agentConn is agenttest.Client with the VM tests' helpers.
type agentConn struct {
	*agenttest.Client
	t *testing.T
}

// agentCallTimeout bounds one request or wait in these tests (a 9p setup
// of a nested guest is slow, never this slow).
const agentCallTimeout = 5 * time.Minute

// dialAgent reads the agent's hello on conn.
func dialAgent(t *testing.T, conn io.ReadWriteCloser) *agentConn {
	t.Helper()
	c := agenttest.Dial(t, conn)
	c.SetTimeout(agentCallTimeout)
	return &agentConn{Client: c, t: t}
}

// call sends a request that has no result.
func (a *agentConn) call(method string, params any) error {
	a.t.Helper()
	return a.Call(method, params, nil)
}

// waitExit waits until process id exits and returns its stdout; an error
// event of the process fails the test.
func (a *agentConn) waitExit(id string) (string, protocol.Event) {
	a.t.Helper()
	out := a.WaitFor(id, "its exit", func(p *agenttest.Output) bool { return p.Exit != nil || len(p.Errors) > 0 })
	if len(out.Errors) > 0 {
		a.t.Fatalf("process %s: %s", id, out.Errors[0])
	}
	return out.Stdout.String(), *out.Exit
}

// A real guest boots, its agent connects over vsock, the host's system
// directories and a session directory are mounted over virtio-fs (round 0,
// the default) or virtio-9p (round 1, COWORK_VMM_FS=9p), a spawned shell
// reads and writes through the mount, and the agent's shutdown ends the VM
// cleanly. Round 0 also takes the snapshot round 2 restores (a warm
// start): the restored guest passes the same. Repeated to report the
// start-to-connected figure.
func TestKVMBootAgentMountsAndShutdown(t *testing.T) {
	bin := requireKVMBoot(t)
	log := slog.New(slog.NewTextHandler(&testLogWriter{t: t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// The guest's console goes to the test log; COWORK_VMM_TEST_CMDLINE adds
	// kernel parameters (e.g. loglevel=7 to see the boot).
	opts := Options{Executable: bin, Logger: log, Console: &testLogWriter{t: t}, Cmdline: os.Getenv("COWORK_VMM_TEST_CMDLINE"),
		PVH: os.Getenv("COWORK_VMM_TEST_PVH") == "1"}
	b9opts := opts
	b9opts.FileSharing = FileSharingNineP
	b9 := New(b9opts)
	opts.SnapshotDir = t.TempDir()
	b := New(opts)
	var connectTimes []time.Duration
	for round := range 3 {
		start := time.Now()
		b, kind := b, protocol.MountKindVirtioFS
		if round == 1 {
			b, kind = b9, protocol.MountKindNineP
		}
		var stepsMu sync.Mutex
		var steps []string
		g, err := b.Start(t.Context(), helper.GuestConfig{MemoryMiB: 512, CPUCount: 2, StepFunc: func(step, status string) {
			stepsMu.Lock()
			steps = append(steps, step+":"+status)
			stepsMu.Unlock()
		}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		conn, err := g.Agent(ctx)
		cancel()
		if err != nil {
			g.Stop(context.Background())
			t.Fatalf("round %d: %v", round, err)
		}
		a := dialAgent(t, conn)
		hello := a.Hello()
		connected := time.Since(start)
		connectTimes = append(connectTimes, connected)
		if hello.PID != 1 {
			t.Fatalf("hello %+v: want the agent's hello from PID 1", hello)
		}
		t.Logf("round %d: start → agent hello in %v (kernel %s)", round, connected, hello.Kernel)

		if round == 0 && g.Egress() == nil {
			t.Error("the guest offers no egress listener (Guest.Egress): its processes would have no network")
		}
		if restored := g.(*guest).Restored(); restored != (round == 2) {
			t.Errorf("round %d: restored from a snapshot %v, want %v", round, restored, round == 2)
		}
		if round == 0 {
			checkProgressMoves(t, g, a)
		}
		exerciseGuest(t, g, a, kind)
		shutdownGuest(t, g, a)
		if err := g.Err(); err != nil {
			t.Errorf("round %d: the VM ended with %v, want a clean end", round, err)
		}
		conn.Close()
		if err := g.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
		stepsMu.Lock()
		for _, want := range []string{StepCreateVM, StepLoadKernel, StepGuestBoot, StepAgentConnect} {
			if !slices.Contains(steps, want+":started") || !slices.Contains(steps, want+":completed") {
				t.Errorf("steps %v lack %s started/completed", steps, want)
			}
		}
		stepsMu.Unlock()
	}
	slices.Sort(connectTimes)
	t.Logf("KVMFIGURE start_to_agent_hello median=%v all=%v", connectTimes[len(connectTimes)/2], connectTimes)
	if !t.Failed() {
		nested.RecordLinuxBoot(t)
	}
}

// checkProgressMoves checks the guest's progress (helper.ProgressReporter,
// its vCPUs' exits) moves while its agent answers a ping.
func checkProgressMoves(t *testing.T, g helper.Guest, a *agentConn) {
	t.Helper()
	reporter, ok := g.(helper.ProgressReporter)
	if !ok {
		t.Fatal("the kvm guest does not implement helper.ProgressReporter: a busy guest would be declared dead")
	}
	before, ok := reporter.Progress()
	if !ok {
		t.Log("no vCPU progress on this kernel (KVM binary statistics need Linux 5.14)")
		return
	}
	if err := a.call(protocol.AgentMethodPing, nil); err != nil {
		t.Fatalf("ping: %v", err)
	}
	after, ok := reporter.Progress()
	if !ok || after <= before {
		t.Errorf("progress %d → %d (ok %v) over a ping: want it to move", before, after, ok)
	}
}

// shutdownGuest has the agent shut the guest down and waits for its end.
func shutdownGuest(t *testing.T, g helper.Guest, a *agentConn) {
	t.Helper()
	if err := a.call(protocol.AgentMethodShutdown, protocol.ShutdownParams{GraceMillis: 1000}); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	select {
	case <-g.Done():
	case <-time.After(time.Minute):
		t.Fatal("the VM did not end after the agent's shutdown")
	}
}

// setupGuestRoot sets the guest's root up as the helper does: the system
// directories on the cached system device, whose sources must be of kind
// (a protocol.MountKind).
func setupGuestRoot(t *testing.T, g helper.Guest, a *agentConn, kind string) {
	t.Helper()
	setup := protocol.SetupParams{Hostname: "cowork"}
	sharer, ok := g.(helper.SystemSharer)
	if !ok {
		t.Fatal("the kvm guest does not implement helper.SystemSharer: system directories would be uncached")
	}
	for _, dir := range helper.DefaultSystemDirs {
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		src, err := sharer.ShareSystem(dir)
		if err != nil {
			t.Fatal(err)
		}
		if src.Kind != kind {
			t.Fatalf("ShareSystem(%s) returned a %s source, want %s", dir, src.Kind, kind)
		}
		setup.System = append(setup.System, protocol.Mount{Source: src, Target: dir, ReadOnly: true})
	}
	g.(helper.SetupAdjuster).AdjustSetup(&setup)
	if err := a.call(protocol.AgentMethodSetup, setup); err != nil {
		t.Fatalf("setup: %v", err)
	}
}

// exerciseGuest sets the guest's root up over the file-sharing devices of
// kind, a protocol.MountKind (the system directories on the cached system
// device, as the helper does), and runs a shell that reads and writes a
// shared directory, which stays uncached: a host edit is seen.
func exerciseGuest(t *testing.T, g helper.Guest, a *agentConn, kind string) {
	t.Helper()
	setupGuestRoot(t, g, a, kind)
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "in.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := g.Share(host, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{Source: src, Target: "/sessions/t/mnt/work"}}); err != nil {
		t.Fatalf("mount: %v", err)
	}
	roSrc, err := g.Share(host, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.call(protocol.AgentMethodMount, protocol.MountParams{Mount: protocol.Mount{Source: roSrc, Target: "/sessions/t/mnt/ro", ReadOnly: true}}); err != nil {
		t.Fatalf("mount ro: %v", err)
	}
	// The mount table: a virtio-fs device's caching is its own (not a
	// mount option); 9p's is the mount's cache option.
	usr := `grep -q '^` + SystemMountTag + ` /usr virtiofs ro,' /proc/mounts && echo usr-cached; `
	work := `grep -q '^` + MountTag + ` /sessions/t/mnt/work virtiofs rw,' /proc/mounts && echo work-uncached`
	if kind == protocol.MountKindNineP {
		usr = `grep -q '^` + SystemMountTag + ` /usr 9p ro,.*loose' /proc/mounts && echo usr-cached; `
		work = `grep -q '^` + MountTag + ` /sessions/t/mnt/work 9p rw,' /proc/mounts && ! grep '/sessions/t/mnt/work ' /proc/mounts | grep -q loose && echo work-uncached`
	}
	script := `cat /sessions/t/mnt/work/in.txt; echo "from the guest" > /sessions/t/mnt/work/out.txt; ` +
		`if echo x > /sessions/t/mnt/ro/nope 2>/dev/null; then echo ro-writable; else echo ro-refused; fi; uname -r; ` + usr + work
	spawn := protocol.SpawnParams{ID: "p1", Session: "t", UID: protocol.FirstSessionUID, Command: "/bin/sh", Args: []string{"-c", script}, Cwd: "/sessions/t",
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}}
	if err := a.call(protocol.AgentMethodSpawn, spawn); err != nil {
		t.Fatalf("spawn: %v", err)
	}
	out, exit := a.waitExit("p1")
	if exit.ExitCode == nil || *exit.ExitCode != 0 {
		t.Errorf("shell exit %+v, output %q", exit, out)
	}
	if !strings.Contains(out, "from the host") || !strings.Contains(out, "ro-refused") {
		t.Errorf("shell output %q: want the host file and a refused read-only write", out)
	}
	if !strings.Contains(out, "usr-cached") || !strings.Contains(out, "work-uncached") {
		t.Errorf("shell output %q: want /usr read-only on the %s device %s (cached), the shared directory on %s uncached",
			out, kind, SystemMountTag, MountTag)
	}
	// The shared directory is uncached: an open after a host edit reads
	// it, once the attributes the guest holds (its size) have outlived
	// their lifetime. A rename over the file would be seen at once
	// (virtiofs tests).
	if err := os.WriteFile(filepath.Join(host, "in.txt"), []byte("edited on the host, longer than before\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(virtiofs.CoherentTimeout + 100*time.Millisecond)
	reread := protocol.SpawnParams{ID: "p2", Session: "t", UID: protocol.FirstSessionUID, Command: "/bin/cat", Args: []string{"/sessions/t/mnt/work/in.txt"}, Cwd: "/sessions/t",
		Env: spawn.Env}
	if err := a.call(protocol.AgentMethodSpawn, reread); err != nil {
		t.Fatalf("spawn: %v", err)
	}
	if out, exit := a.waitExit("p2"); out != "edited on the host, longer than before\n" || exit.ExitCode == nil || *exit.ExitCode != 0 {
		t.Errorf("guest re-read %q (exit %+v); want the host's edit", out, exit)
	}
	got, err := os.ReadFile(filepath.Join(host, "out.txt"))
	if err != nil || string(got) != "from the guest\n" {
		t.Errorf("host sees %q, %v; want the guest's write", got, err)
	}
	if _, err := os.Stat(filepath.Join(host, "nope")); err == nil {
		t.Error("a write through the read-only mount reached the host")
	}
	t.Logf("guest shell said (%s): %s", kind, strings.TrimSpace(out))
}
