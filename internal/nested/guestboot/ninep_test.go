package guestboot

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/p9"
	"github.com/cowork-vmm/cowork-vmm/devices/p9/fs"
	"github.com/cowork-vmm/cowork-vmm/internal/nested"
	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot/ninep"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/vmm"
)

func TestNinePFigureLineRoundTrip(t *testing.T) {
	f := NinePFigure{VMM: "qemu-microvm", Run: 3, Result: ninep.Result{Bytes: 32 << 20, Write: 2 * time.Second, Read: time.Second, Msize: 262144},
		Window: 3500 * time.Millisecond, Busy: 2 * time.Second}
	line := f.FigureLine()
	require.Contains(t, line, "write_MBps=16.8 read_MBps=33.6")
	got, ok := ParseNinePFigureLine("    ninep_test.go:80: " + line)
	require.True(t, ok)
	require.Equal(t, f, got)
	for _, bad := range []string{"no figure", "NINEPFIGURE vmm=x run=one bytes=1", "NINEPFIGURE vmm=x bytes", "NINEPFIGURE run=1 bytes=5", "NINEPFIGURE vmm=x run=1"} {
		_, ok := ParseNinePFigureLine(bad)
		require.False(t, ok, bad)
	}
}

func TestNinePResultFromConsole(t *testing.T) {
	want := ninep.Result{Bytes: 1 << 20, Write: time.Millisecond, Read: time.Microsecond, Msize: 4096}
	got, err := NinePResult("[ 0.5] booting\r\nTESTINIT OK cpus=0 uptime=0.6\r\n" + want.Line() + "\r\nTESTINIT DONE\r\n")
	require.NoError(t, err)
	require.Equal(t, want, got)

	_, err = NinePResult("TESTINIT OK\n" + ninep.Result{Err: "mount: no such device"}.Line() + "\n")
	require.ErrorContains(t, err, "mount: no such device")
	_, err = NinePResult("TESTINIT OK\nTESTINIT DONE\n")
	require.ErrorContains(t, err, "no 9p result")
	_, err = NinePResult(ninep.Marker + " bytes=1\n")
	require.Error(t, err)
}

func TestQemuNinePArgs(t *testing.T) {
	args, err := QemuNinePArgs("/tmp/d", "tag")
	require.NoError(t, err)
	require.Equal(t, []string{"-fsdev", "local,id=ninepbench,path=/tmp/d,security_model=none", "-device", "virtio-9p-device,fsdev=ninepbench,mount_tag=tag"}, args)
	_, err = QemuNinePArgs("/tmp/a,b", "tag")
	require.Error(t, err)
}

// TestThroughput9p measures the test guest writing and reading a file over
// 9p on our VMM (devices/p9) and on qemu microvm (virtio-9p-device), both
// exporting the same host directory, interleaved, three runs each, one
// vCPU. It prints a NINEPFIGURE line per run; internal/nested's
// TestNested9pThroughput runs it inside the nested harness and reports the
// medians and ratios. It fails only when a guest reports an error or none.
func TestThroughput9p(t *testing.T) {
	kernel, initrd := guestFiles(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	mib := DefaultNinePMiB
	if v := os.Getenv(EnvNinePMiB); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "%s=%q", EnvNinePMiB, v)
		mib = n
	}
	cfg := ninep.Config{Tag: "ninepbench", Aname: "bench", MiB: mib}
	require.NoError(t, cfg.Validate())
	dir := t.TempDir()
	logger := slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))

	const runs = 3
	for run := 1; run <= runs; run++ {
		for _, name := range []string{"cowork-vmm", "qemu-microvm"} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			var res ninep.Result
			var err error
			window := &busyWindow{}
			if name == "cowork-vmm" {
				res, err = ninePOnCoworkVMM(ctx, kernel, initrd, dir, cfg, logger, window)
			} else {
				res, err = ninePOnQemu(ctx, kernel, initrd, dir, cfg, window)
			}
			cancel()
			require.NoError(t, err, "%s, run %d", name, run)
			requireWrittenFile(t, filepath.Join(dir, ninep.FileName), mib)
			require.NoError(t, os.Remove(filepath.Join(dir, ninep.FileName)))
			wall, busy := window.result()
			if name == "cowork-vmm" {
				st := window.exits()
				t.Logf("cowork-vmm run %d, ready to result: %d KVM_RUNs, %d MMIO exits, %d port I/O exits, %d interrupted", run, st.Runs, st.MMIOExits, st.IOExits, st.Interrupted)
			}
			t.Log(NinePFigure{VMM: name, Run: run, Result: res, Window: wall, Busy: busy}.FigureLine())
		}
	}
	nested.RecordLinuxBoot(t)
}

// ninePOnCoworkVMM boots the test guest on our VMM with our 9p device
// exporting dir read-write as cfg.Aname.
func ninePOnCoworkVMM(ctx context.Context, kernel, initrd, dir string, cfg ninep.Config, logger *slog.Logger, window *busyWindow) (ninep.Result, error) {
	exports := fs.NewExports(logger)
	defer exports.Close()
	if err := exports.Add(cfg.Aname, dir, false); err != nil {
		return ninep.Result{}, err
	}
	dev, err := p9.New(p9.Options{Tag: cfg.Tag, Attacher: exports, Logger: logger})
	if err != nil {
		return ninep.Result{}, err
	}
	defer dev.Close() // after the machine's Stop: its reset's clunks are answered
	watch := NewConsoleWatcher(time.Now())
	m, err := machine.New(machine.Config{
		Kernel: kernel, Initrd: initrd, CPUs: 1, MemMiB: 512,
		Console: io.MultiWriter(watch, window), Logger: logger, Cmdline: cfg.Cmdline(),
	})
	if err != nil {
		return ninep.Result{}, err
	}
	window.vmStats = m.VM().Stats // before Start: the console is quiet until then
	defer m.Stop()                //nolint:errcheck // the explicit Stop below reports
	if _, err := m.AddVirtioMMIO(dev); err != nil {
		return ninep.Result{}, err
	}
	if err := m.Start(); err != nil {
		return ninep.Result{}, err
	}
	select {
	case <-m.Done():
	case <-ctx.Done():
		return ninep.Result{}, fmt.Errorf("the guest did not end in time; console:\n%s", tailLines(watch.Console(), 40))
	}
	exit := m.Wait()
	if _, err := m.Stop(); err != nil {
		return ninep.Result{}, err
	}
	res, err := NinePResult(watch.Console())
	if err != nil {
		return res, fmt.Errorf("%w; the VM ended with %v; console:\n%s", err, exit, tailLines(watch.Console(), 40))
	}
	return res, nil
}

// ninePOnQemu boots the test guest on qemu microvm with its virtio-9p
// device exporting dir (qemu ignores the attach name: its root is dir).
func ninePOnQemu(ctx context.Context, kernel, initrd, dir string, cfg ninep.Config, window *busyWindow) (ninep.Result, error) {
	args, err := QemuNinePArgs(dir, cfg.Tag)
	if err != nil {
		return ninep.Result{}, err
	}
	console := NewConsoleWatcher(time.Now())
	_, bootErr := QemuMicrovmWith(ctx, QemuOptions{
		Machine: QemuNineMachine, Kernel: kernel, Initrd: initrd, CPUs: 1, MemMiB: 512,
		Append: cfg.Cmdline(), Args: args, Console: io.MultiWriter(console, window),
	})
	res, err := NinePResult(console.Console())
	if err != nil {
		return res, fmt.Errorf("%w (qemu: %v); console:\n%s", err, bootErr, tailLines(console.Console(), 40))
	}
	return res, nil
}

// requireWrittenFile checks, on the host side, that the guest's file has
// its size and its first and last blocks' stamps (ninep.StampBlock).
func requireWrittenFile(t *testing.T, path string, mib int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	info, err := f.Stat()
	require.NoError(t, err)
	require.Equal(t, int64(mib)*ninep.BlockSize, info.Size())
	stamp := make([]byte, 8)
	_, err = f.ReadAt(stamp, int64(mib-1)*ninep.BlockSize)
	require.NoError(t, err)
	require.Equal(t, uint64(mib-1), ninep.BlockStamp(stamp), "the last block's stamp")
	_, err = f.ReadAt(stamp, 0)
	require.NoError(t, err)
	require.Zero(t, ninep.BlockStamp(stamp), "the first block's stamp")
}

// busyWindow is a console sink that notes the wall time and this
// machine's busy CPU time (/proc/stat) at testinit's ready line and at its
// 9p line. Console writers may be called from several goroutines.
type busyWindow struct {
	// vmStats, when set, is sampled at both lines too (our VMM's exits).
	vmStats func() vmm.Stats

	mu         sync.Mutex
	line       []byte
	startWall  time.Time
	startBusy  time.Duration
	wall, busy time.Duration
	startStats vmm.Stats
	stats      vmm.Stats // the difference
}

func (w *busyWindow) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range p {
		if c != '\n' {
			if len(w.line) < 4096 {
				w.line = append(w.line, c)
			}
			continue
		}
		line := string(w.line)
		w.line = w.line[:0]
		switch {
		case strings.Contains(line, ReadyMarker) && w.startWall.IsZero():
			w.startWall, w.startBusy = time.Now(), machineBusy()
			if w.vmStats != nil {
				w.startStats = w.vmStats()
			}
		case strings.Contains(line, ninep.Marker) && !w.startWall.IsZero() && w.wall == 0:
			w.wall, w.busy = time.Since(w.startWall), machineBusy()-w.startBusy
			if w.vmStats != nil {
				end := w.vmStats()
				w.stats = vmm.Stats{Runs: end.Runs - w.startStats.Runs, IOExits: end.IOExits - w.startStats.IOExits,
					MMIOExits: end.MMIOExits - w.startStats.MMIOExits, Interrupted: end.Interrupted - w.startStats.Interrupted}
			}
		}
	}
	return len(p), nil
}

// exits returns the vmStats difference between the two lines.
func (w *busyWindow) exits() vmm.Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

func (w *busyWindow) result() (wall, busy time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wall, w.busy
}

// machineBusy is the CPU time all CPUs spent not idle since boot (the
// "cpu" line of /proc/stat, in USER_HZ ticks, less idle and iowait); 0 if
// unreadable.
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(first)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0
		}
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is already counted in user.
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / userHZ
}

// userHZ is the unit of /proc/stat: USER_HZ, 100 on every Linux ABI.
const userHZ = 100

// testLogWriter sends the VMM's warnings to the test log.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestBusyWindow(t *testing.T) {
	require.Positive(t, machineBusy(), "this machine has run something since boot")
	w := &busyWindow{}
	_, err := w.Write([]byte("[ 0.1] boot\r\nTESTINIT OK cpus=0 uptime=0.2\r\n"))
	require.NoError(t, err)
	wall, _ := w.result()
	require.Zero(t, wall, "no 9p line yet")
	time.Sleep(20 * time.Millisecond)
	_, err = w.Write([]byte(ninep.Marker + " bytes=1 write_ns=1 read_ns=1 msize=1\r\nTESTINIT DONE\r\n"))
	require.NoError(t, err)
	wall, busy := w.result()
	require.GreaterOrEqual(t, wall, 20*time.Millisecond)
	require.GreaterOrEqual(t, busy, time.Duration(0))
}
