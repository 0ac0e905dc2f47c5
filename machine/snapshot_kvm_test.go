package machine

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/rng"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// waitConsole waits until console holds want.
func waitConsole(t *testing.T, console *syncBuffer, want string, within time.Duration) {
	t.Helper()
	waitTranscript(t, console.String, want, within)
}

// waitTranscript waits until read's text holds want.
func waitTranscript(t *testing.T, read func() string, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(read(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q on the console within %v; it shows:\n%s", want, within, read())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestKVMSnapshotRestoresALinuxGuest boots our guest kernel with the test
// init ticking on the console (a timer and the UART in use, a virtio-rng
// device active), snapshots it mid-way, stops it, and restores a new
// machine from the file: the restored guest goes on ticking from the next
// tick, its clock running, and ends with its restart.
func TestKVMSnapshotRestoresALinuxGuest(t *testing.T) {
	snapshotRestoresALinuxGuest(t, 1)
}

// snapshotRestoresALinuxGuest is TestKVMSnapshotRestoresALinuxGuest on
// a guest of cpus vCPUs.
func snapshotRestoresALinuxGuest(t *testing.T, cpus int) {
	nested.RequireLinuxBoot(t, "TestNestedKVM")
	if !vmm.StateSupported {
		t.Skip("the VMM cannot save a VM's state on this architecture yet")
	}
	kernelPath, initrdPath := testBootImages(t)
	const totalTicks = 40
	cfg := Config{MemMiB: 256, CPUs: cpus, Logger: quietLogger(), Cmdline: fmt.Sprintf("guestboot.ticks=%d", totalTicks)}
	first := &syncBuffer{}
	bootCfg := cfg
	bootCfg.Kernel, bootCfg.Initrd, bootCfg.Console = kernelPath, initrdPath, io.MultiWriter(first, testLogWriter{t})
	m, err := New(bootCfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddVirtioMMIO(rng.New(quietLogger())); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		m.Stop()
		t.Fatal(err)
	}
	waitConsole(t, first, "TESTINIT TICK 3 ", 4*time.Minute)
	id := m.Identity("test-build", "test-kernel")
	path := filepath.Join(t.TempDir(), "vm.snap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	snapErr := m.Snapshot(f, id)
	took := time.Since(began)
	if err := f.Close(); err != nil && snapErr == nil {
		snapErr = err
	}
	if _, err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	if snapErr != nil {
		t.Fatal(snapErr)
	}
	last := lastTick(first.String())
	t.Logf("snapshot of 256 MiB after tick %d in %v: %s", last, took, fileSize(t, path))

	second := &syncBuffer{}
	restoreCfg := cfg
	restoreCfg.Console = io.MultiWriter(second, testLogWriter{t})
	began = time.Now()
	sf, err := snapshot.Open(path, id)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restore(restoreCfg, sf)
	if err != nil {
		sf.Close()
		t.Fatal(err)
	}
	defer r.Stop()
	if _, err := r.AddVirtioMMIO(rng.New(quietLogger())); err != nil {
		t.Fatal(err)
	}
	err = r.StartRestored()
	sf.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restored and running in %v", time.Since(began))
	// The snapshot may fall in the middle of a line, so the two consoles
	// are read as one stream: the first machine's output, then the
	// restored one's.
	transcript := func() string { return first.String() + second.String() }
	waitTranscript(t, transcript, fmt.Sprintf("TESTINIT TICK %d ", last+1), 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	select {
	case <-r.Done():
	case <-ctx.Done():
		t.Fatalf("the restored guest did not finish; its console:\n%s", second.String())
	}
	e, err := r.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if err := ticksOnceEach(transcript(), totalTicks); err != nil {
		t.Errorf("%v; the restored guest's console:\n%s", err, second.String())
	}
	if !strings.Contains(second.String(), "TESTINIT DONE") {
		t.Errorf("the restored guest did not tick to the end; its console:\n%s", second.String())
	}
	if e.Kind != vmm.ExitReset && e.Kind != vmm.ExitTripleFault {
		t.Errorf("exit %v, want the guest's restart", e)
	}
}

// fileSize describes the size of the file at path and the bytes its
// blocks take (a snapshot leaves untouched RAM as holes).
func fileSize(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		used = st.Blocks * 512
	}
	return fmt.Sprintf("file of %d bytes, %d allocated", fi.Size(), used)
}

// ticksOnceEach checks that out holds the ticks 1 to total, each once
// and in order, and nothing after DONE.
func ticksOnceEach(out string, total int) error {
	want := 1
	for _, line := range strings.Split(out, "\n") {
		i := strings.Index(line, "TESTINIT TICK ")
		if i < 0 {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(line[i:], "TESTINIT TICK %d", &n); err != nil {
			return fmt.Errorf("tick line %q: %v", line, err)
		}
		if n != want {
			return fmt.Errorf("tick %d where tick %d was due", n, want)
		}
		want++
	}
	if want != total+1 {
		return fmt.Errorf("the ticks stop at %d of %d", want-1, total)
	}
	return nil
}

// lastTick returns the number of the last "TESTINIT TICK n" in out.
func lastTick(out string) int {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, "TESTINIT TICK "); i >= 0 {
			fmt.Sscanf(line[i:], "TESTINIT TICK %d", &n)
		}
	}
	return n
}

// TestTicksOnceEachReadsALineSplitBySnapshot replays the console of a run
// whose snapshot fell inside tick 4's line, and ones that repeat or skip.
func TestTicksOnceEachReadsALineSplitBySnapshot(t *testing.T) {
	first := "TESTINIT OK\nTESTINIT TICK 1 uptime=3.2\nTESTINIT TICK 2 uptime=3.3\nTESTINIT TICK 3 uptime=3.4\nTEST"
	if err := ticksOnceEach(first+"INIT TICK 4 uptime=3.5\nTESTINIT TICK 5 x\nTESTINIT DONE\n", 5); err != nil {
		t.Errorf("a split line: %v", err)
	}
	if err := ticksOnceEach(first+"INIT TICK 4 u\nTESTINIT TICK 4 u\nTESTINIT TICK 5 u\n", 5); err == nil {
		t.Error("a repeated tick passed")
	}
	if err := ticksOnceEach(first+"INIT TICK 5 u\n", 5); err == nil {
		t.Error("a skipped tick passed")
	}
	if err := ticksOnceEach(first+"INIT TICK 4 u\n", 5); err == nil {
		t.Error("missing ticks passed")
	}
}
