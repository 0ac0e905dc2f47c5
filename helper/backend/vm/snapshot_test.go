package vm

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// Two guests restored from one snapshot are two machines: each gets its
// own kernel boot id and its own random stream (the agent reseeds from
// the VMM's entropy device), and the wall clock the helper's.
func TestKVMWarmStartsDiffer(t *testing.T) {
	bin := requireKVMBoot(t)
	log := slog.New(slog.NewTextHandler(&testLogWriter{t: t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	dir := t.TempDir()
	b := New(Options{Executable: bin, Logger: log, Console: &testLogWriter{t: t}, SnapshotDir: dir,
		Cmdline: os.Getenv("COWORK_VMM_TEST_CMDLINE"), PVH: os.Getenv("COWORK_VMM_TEST_PVH") == "1"})
	const script = `cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1; date +%s`
	cold, restored := runGuestScript(t, b, script)
	if restored {
		t.Fatal("the first start was restored from a snapshot that did not exist")
	}
	snaps, _ := filepath.Glob(filepath.Join(dir, "*.snap"))
	if len(snaps) != 1 {
		t.Fatalf("after a cold start the snapshot directory holds %v, want one snapshot", snaps)
	}
	var outs []string
	for range 2 {
		out, restored := runGuestScript(t, b, script)
		if !restored {
			t.Fatal("a start after the snapshot was taken booted cold")
		}
		outs = append(outs, out)
	}
	t.Logf("cold:\n%s\nwarm:\n%s\nwarm:\n%s", cold, outs[0], outs[1])
	a, c := strings.Fields(outs[0]), strings.Fields(outs[1])
	if len(a) < 3 || len(c) < 3 {
		t.Fatalf("guest output %q, %q: want a boot id, random bytes and the time", outs[0], outs[1])
	}
	if a[0] == c[0] {
		t.Errorf("two restored guests share the boot id %s", a[0])
	}
	if strings.Join(a[1:len(a)-1], "") == strings.Join(c[1:len(c)-1], "") {
		t.Errorf("two restored guests read the same random bytes %v", a[1:len(a)-1])
	}
	for _, out := range outs {
		f := strings.Fields(out)
		var guestNow int64
		if _, err := fmt.Sscan(f[len(f)-1], &guestNow); err != nil || time.Since(time.Unix(guestNow, 0)).Abs() > time.Minute {
			t.Errorf("a restored guest's clock says %s, the host's %d", f[len(f)-1], time.Now().Unix())
		}
	}
}

// runGuestScript starts a guest on b, sets its root up as the helper does,
// runs script in a shell, shuts the guest down and returns the shell's
// output and whether the guest was restored from a snapshot.
func runGuestScript(t *testing.T, b *Backend, script string) (string, bool) {
	t.Helper()
	g, err := b.Start(t.Context(), helper.GuestConfig{MemoryMiB: 512, CPUCount: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop(context.Background())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	conn, err := g.Agent(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	a := dialAgent(t, conn)
	setupGuestRoot(t, g, a, protocol.MountKindVirtioFS)
	spawn := protocol.SpawnParams{ID: "p", Session: "t", UID: protocol.FirstSessionUID, Command: "/bin/sh", Args: []string{"-c", script}, Cwd: "/",
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}}
	if err := a.call(protocol.AgentMethodSpawn, spawn); err != nil {
		t.Fatalf("spawn: %v", err)
	}
	out, exit := a.waitExit("p")
	if exit.ExitCode == nil || *exit.ExitCode != 0 {
		t.Errorf("shell exit %+v, output %q", exit, out)
	}
	shutdownGuest(t, g, a)
	return out, g.(*guest).Restored()
}

// TestDiscardSnapshot: a restored guest's DiscardSnapshot (the helper's
// answer to its death before set-up) removes its snapshot and the check
// record beside it, so the next start boots cold; a cold-booted guest's
// removes nothing.
func TestDiscardSnapshot(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "0123.snap")
	for _, p := range []string{snap, snap + snapshot.VerifiedSuffix} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var h helper.Restorable = &guest{}
	h.DiscardSnapshot()
	if got := Snapshots(dir); len(got) != 1 || h.Restored() {
		t.Fatalf("a cold-booted guest discarded a snapshot (left %v) or says it was restored", got)
	}
	h = &guest{snapshotPath: snap}
	h.DiscardSnapshot()
	for _, p := range []string{snap, snap + snapshot.VerifiedSuffix} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after DiscardSnapshot (%v)", p, err)
		}
	}
}
