package vm

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ninep "github.com/cowork-vmm/cowork-vmm/devices/p9"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"

	"github.com/hugelgupf/p9/p9"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testGuest is a guest without a machine, for the parts that need none,
// with the default file-sharing devices (virtio-fs), not attached.
func testGuest(t *testing.T) *guest {
	kind, err := FileSharingKind("")
	if err != nil {
		t.Fatal(err)
	}
	return testGuestOf(t, kind)
}

// testGuestOf is testGuest with file-sharing devices of kind (a
// protocol.MountKind).
func testGuestOf(t *testing.T, kind string) *guest {
	g := newGuestState(newConsole(quiet(), nil), quiet(), kind)
	for _, d := range []struct {
		dev    **ShareDevice
		tag    string
		cached bool
	}{{&g.files, MountTag, false}, {&g.sysFiles, SystemMountTag, true}} {
		s, _, err := NewShareDevice(kind, d.tag, d.cached, fdlimit.NewPool(0).Share(0), quiet())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		*d.dev = s
	}
	return g
}

func TestShareSystemUsesTheCachedSystemDevice(t *testing.T) {
	g := testGuest(t)
	sysDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(sysDir, "libc.so"), []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sharer helper.SystemSharer = g
	src, err := sharer.ShareSystem(sysDir)
	if err != nil {
		t.Fatal(err)
	}
	want := protocol.MountSource{Kind: protocol.MountKindVirtioFS, Tag: SystemMountTag, Aname: src.Aname}
	if src != want || src.Aname == "" || strings.ContainsRune(src.Aname, '/') {
		t.Fatalf("ShareSystem: %+v, want %+v with a single-component aname", src, want)
	}
	if names := g.sysFiles.exports.Names(); !slices.Equal(names, []string{src.Aname}) {
		t.Errorf("system device exports %v, want [%s]", names, src.Aname)
	}
	if names := g.files.exports.Names(); len(names) != 0 {
		t.Errorf("the uncached device got exports %v from ShareSystem", names)
	}
	// The export is read-only on the host side, whatever the agent mounts.
	root, err := ninep.ExportsAttacher(g.sysFiles.exports).Attach()
	if err != nil {
		t.Fatal(err)
	}
	_, dir, err := root.Walk([]string{src.Aname})
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	_, f, err := dir.Walk([]string{"libc.so"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.WriteOnly); err == nil {
		t.Error("a system export opened a file for writing")
	}

	// Share stays on the uncached device, and attach names never collide
	// across the two devices.
	other, err := g.Share(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	if other.Tag != MountTag || other.Cache != protocol.NinePCacheNone || other.Aname == src.Aname {
		t.Errorf("Share after ShareSystem: %+v (system export %+v)", other, src)
	}
}

func TestShareSystemRefusesBadPathsAndAMissingDevice(t *testing.T) {
	g := testGuest(t)
	for _, p := range []string{"usr", "/usr/../etc", "", filepath.Join(t.TempDir(), "missing")} {
		if _, err := g.ShareSystem(p); err == nil {
			t.Errorf("ShareSystem(%q) accepted", p)
		}
	}
	if names := g.sysFiles.exports.Names(); len(names) != 0 {
		t.Errorf("refused shares left exports: %v", names)
	}
	var noDevice guest
	if _, err := noDevice.ShareSystem(t.TempDir()); err == nil || !strings.Contains(err.Error(), SystemMountTag) {
		t.Errorf("ShareSystem without the system device: %v, want an error naming %q", err, SystemMountTag)
	}
}

func TestShareRegistersExports(t *testing.T) {
	g := testGuest(t)
	ro, rw := t.TempDir(), t.TempDir()
	a, err := g.Share(ro, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.Share(rw, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range []protocol.MountSource{a, b} {
		if src.Kind != protocol.MountKindVirtioFS || src.Tag != MountTag || src.Cache != "" || src.Aname == "" || strings.ContainsRune(src.Aname, '/') {
			t.Fatalf("source %+v: want a virtiofs export of tag %s named by a single-component aname", src, MountTag)
		}
	}
	if a == b {
		t.Fatalf("sources %+v, %+v: want distinct exports", a, b)
	}
	names := g.files.exports.Names()
	want := []string{a.Aname, b.Aname}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("exports %v, want %v", names, want)
	}
	// The same directory shared twice gets two names (two mounts may differ in mode).
	c, err := g.Share(ro, false)
	if err != nil || c == a {
		t.Errorf("second share of %s: %+v, %v", ro, c, err)
	}
}

func TestShareRefusesBadPaths(t *testing.T) {
	g := testGuest(t)
	for _, p := range []string{"relative/dir", "/a/../b", "/a/", ""} {
		if _, err := g.Share(p, true); err == nil {
			t.Errorf("Share(%q) accepted", p)
		}
	}
	if _, err := g.Share(filepath.Join(t.TempDir(), "missing"), true); err == nil {
		t.Error("Share of a missing directory accepted")
	}
	if len(g.files.exports.Names()) != 0 {
		t.Errorf("refused shares left exports: %v", g.files.exports.Names())
	}
	var noDevice guest
	if _, err := noDevice.Share(t.TempDir(), true); err == nil {
		t.Error("Share without a file-sharing device accepted")
	}
}

func TestAdjustSetupKeepsTheInitramfsRoot(t *testing.T) {
	g := testGuest(t)
	sys := protocol.Mount{Source: protocol.MountSource{Kind: "9p", Tag: MountTag, Aname: "e1"}, Target: "/usr", ReadOnly: true}
	p := protocol.SetupParams{NewRoot: true, System: []protocol.Mount{sys}}
	var adj helper.SetupAdjuster = g
	adj.AdjustSetup(&p)
	if p.NewRoot {
		t.Error("NewRoot left on: the VM's initramfs is already a throwaway root")
	}
	if len(p.System) != 1 || p.System[0] != sys {
		t.Errorf("system mounts %+v: want them unchanged", p.System)
	}
}

// probeFacts is what kvm.ProbeHost finds on a usable KVM whose trial guest
// ended with trialErr; pvm adds the marks of PVM.
func probeFacts(pvm bool, trialErr error) kvm.HostProbe {
	caps := map[string]bool{}
	for _, c := range kvm.RequiredCapabilities {
		caps[c.String()] = true
	}
	p := kvm.HostProbe{Device: kvm.DevicePath, APIVersion: kvm.APIVersion, Capabilities: caps, Tried: true, TrialErr: trialErr}
	if pvm {
		p.PVM, p.PVMReason = true, "the kvm_pvm module is loaded"
	}
	return p
}

func TestPreflightRefusesPVM(t *testing.T) {
	b := New(Options{Logger: quiet()})
	b.probe = func(string) kvm.HostProbe {
		return probeFacts(true, errors.New("its instruction emulator cannot execute int3 in protected mode"))
	}
	kernelsLooked := false
	b.kernels = func(string) kernel.Sources { kernelsLooked = true; return kernel.Sources{} }
	_, err := b.Start(context.Background(), helper.GuestConfig{})
	if err == nil {
		t.Fatal("Start on a PVM host succeeded")
	}
	for _, want := range []string{"PVM", "kvm_pvm", "int3", "COWORK_VMM_BACKEND=process"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if kernelsLooked {
		t.Error("Start did work before refusing the host")
	}
}

func TestStartWithoutKernelSaysHowToGetOne(t *testing.T) {
	b := New(Options{Logger: quiet(), Executable: "/bin/true"})
	b.probe = func(string) kvm.HostProbe { return probeFacts(false, nil) }
	b.kernels = func(exe string) kernel.Sources {
		return kernel.Sources{Executable: filepath.Join(t.TempDir(), "cowork-vmm"),
			Cache: func() (string, error) { return "", errors.New("no guest kernel built") }}
	}
	var steps []string
	_, err := b.Start(context.Background(), helper.GuestConfig{StepFunc: func(s, st string) { steps = append(steps, s+":"+st) }})
	if err == nil || !strings.Contains(err.Error(), "make kernel") {
		t.Fatalf("err = %v, want the make kernel hint", err)
	}
	if !slices.Equal(steps, []string{StepCreateVM + ":started", StepCreateVM + ":failed"}) {
		t.Errorf("steps %v", steps)
	}
}

func TestExitError(t *testing.T) {
	tail := "[ 1.0] some line"
	for _, tc := range []struct {
		name      string
		exit      vmm.Exit
		connected bool
		panicked  bool
		want      string // "" = nil
	}{
		{"stopped by the host", vmm.Exit{Kind: vmm.ExitStopped}, false, false, ""},
		{"agent powered off", vmm.Exit{Kind: vmm.ExitReset}, true, false, ""},
		{"reset before the agent", vmm.Exit{Kind: vmm.ExitReset}, false, false, "before its agent connected"},
		{"panic reboot", vmm.Exit{Kind: vmm.ExitReset}, true, true, "panicked"},
		{"triple fault", vmm.Exit{Kind: vmm.ExitTripleFault, VCPU: 0}, true, false, "triple fault"},
		{"internal error", vmm.Exit{Kind: vmm.ExitInternalError, VCPU: 1, Detail: "emulation failure"}, true, false, "emulation failure"},
	} {
		err := exitError(tc.exit, tc.connected, tc.panicked, tail)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want nil", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tail) {
			t.Errorf("%s: %v, want %q and the console tail", tc.name, err, tc.want)
		}
	}
}

func TestAgentHandsOutTheConnectionOnce(t *testing.T) {
	g := testGuest(t)
	host, guestEnd := net.Pipe()
	defer guestEnd.Close()
	g.accepted <- acceptResult{conn: host}
	conn, err := g.Agent(context.Background())
	if err != nil || conn != host {
		t.Fatalf("Agent = %v, %v", conn, err)
	}
	if _, err := g.Agent(context.Background()); err == nil {
		t.Error("second Agent call succeeded")
	}
	conn.Close()
}

func TestAgentFailsWhenTheVMDies(t *testing.T) {
	g := testGuest(t)
	g.err = errors.New("the VM failed: triple fault")
	close(g.done)
	_, err := g.Agent(context.Background())
	if err == nil || !strings.Contains(err.Error(), "triple fault") {
		t.Errorf("Agent after death: %v", err)
	}
}

func TestAgentHonoursContext(t *testing.T) {
	g := testGuest(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Agent(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Agent with a cancelled context: %v", err)
	}
}

func TestStopWithoutMachineClosesExports(t *testing.T) {
	g := testGuest(t)
	if _, err := g.Share(t.TempDir(), true); err != nil {
		t.Fatal(err)
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal("second Stop:", err)
	}
	if n := g.files.exports.Names(); len(n) != 0 {
		t.Errorf("exports after Stop: %v", n)
	}
}

func TestAgentGivesUpOnASilentGuest(t *testing.T) {
	g := testGuest(t)
	g.bootTimeout = time.Millisecond
	g.started = time.Now()
	_, err := g.Agent(context.Background())
	if err == nil || !strings.Contains(err.Error(), "did not connect within") || !strings.Contains(err.Error(), "printed nothing") {
		t.Errorf("Agent of a silent guest: %v", err)
	}
	g2 := testGuest(t)
	g2.bootTimeout = time.Millisecond
	g2.started = time.Now()
	g2.con.Write([]byte("[ 0.1] last words\n"))
	if _, err := g2.Agent(context.Background()); err == nil || !strings.Contains(err.Error(), "last words") {
		t.Errorf("Agent error lacks the console tail: %v", err)
	}
}
