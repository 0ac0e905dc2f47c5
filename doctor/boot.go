package doctor

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/process"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/vm"
	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc"
)

// DefaultBootTimeout bounds one trial boot: a real KVM host boots in about
// a second; the nested test harness in about ten.
const DefaultBootTimeout = 90 * time.Second

// trialBootMemoryMiB keeps the trial guest small.
const trialBootMemoryMiB = 512

// trialBoot starts a guest on backend with the helper's own backends,
// waits for the agent's hello and stops the guest.
func trialBoot(ctx context.Context, backend string) (BootResult, error) {
	// The guest's console (VM) or the agent's stderr (process), kept to
	// explain a failed boot.
	console := &tailWriter{max: 4096}
	var b helper.Backend
	switch backend {
	case BackendKVM:
		b = vm.New(vm.Options{Console: console, FileSharing: os.Getenv(vm.FSEnv)})
	case BackendProcess:
		b = process.New(process.Options{Stderr: console})
	default:
		return BootResult{}, fmt.Errorf("unknown backend %q", backend)
	}
	res, err := bootAndGreet(ctx, b)
	if err != nil {
		if tail := console.lastLines(3); tail != "" {
			err = fmt.Errorf("%w; the guest's last output: %s", err, tail)
		}
	}
	return res, err
}

// bootAndGreet starts a guest on b, waits for its agent's hello and stops it.
func bootAndGreet(ctx context.Context, b helper.Backend) (BootResult, error) {
	start := time.Now()
	g, err := b.Start(ctx, helper.GuestConfig{MemoryMiB: trialBootMemoryMiB, CPUCount: 1})
	if err != nil {
		return BootResult{}, err
	}
	defer func() {
		stopCtx, stopCancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer stopCancel()
		_ = g.Stop(stopCtx)
	}()
	conn, err := g.Agent(ctx)
	if err != nil {
		return BootResult{}, fmt.Errorf("waiting for the guest agent: %w", err)
	}
	agent, err := agentrpc.Dial(ctx, conn, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		return BootResult{}, err
	}
	defer agent.Close()
	return BootResult{Elapsed: time.Since(start), Kernel: agent.Hello().Kernel, Memory: guestMemory(g)}, nil
}

// guestMemory describes the guest's memory from its balloon's statistics
// (the kvm backend's MemoryStats), which the driver sends as it starts.
func guestMemory(g any) string {
	ms, ok := g.(interface{ MemoryStats() map[string]uint64 })
	if !ok {
		return ""
	}
	var stats map[string]uint64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if stats = ms.MemoryStats(); len(stats) > 0 {
			break
		}
	}
	if len(stats) == 0 {
		return "no balloon statistics"
	}
	return fmt.Sprintf("balloon: guest RAM %d MiB, free %d MiB, available %d MiB, caches %d MiB",
		stats["total_memory"]>>20, stats["free_memory"]>>20, stats["available_memory"]>>20, stats["caches"]>>20)
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > w.max {
		w.buf = append(w.buf[:0:0], w.buf[len(w.buf)-w.max:]...)
	}
	return len(p), nil
}

// lastLines is the last n non-empty lines, joined by " | ".
func (w *tailWriter) lastLines(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(string(w.buf), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// bootChecks runs the trial boots (--boot) of the backends that passed
// their checks, or records why each was not run.
func (r *runner) bootChecks(kvmReady, processReady bool) (kvmBooted, processBooted bool) {
	kvmBooted = r.bootCheck(CheckBootKVM, "Trial boot (kvm)", BackendKVM, kvmReady, "the kvm backend cannot work here (see above)")
	processBooted = r.bootCheck(CheckBootProcess, "Trial boot (process)", BackendProcess, processReady, "the process backend cannot work here (see above)")
	return kvmBooted, processBooted
}

// bootCheck returns false only when a boot was tried and failed.
func (r *runner) bootCheck(id, title, backend string, ready bool, notReady string) bool {
	c := Check{ID: id, Group: GroupCoworkVMM, Title: title}
	defer func() { r.add(c) }()
	switch {
	case !r.opts.Boot:
		c.Status = StatusSkip
		c.Detail = "not requested: run `cowork-vmm doctor --boot` to boot a guest and time it"
		return true
	case !ready:
		c.Status = StatusSkip
		c.Detail = "not run: " + notReady
		return true
	}
	timeout := r.opts.BootTimeout
	if timeout <= 0 {
		timeout = DefaultBootTimeout
	}
	ctx, cancel := context.WithTimeout(r.ctx, timeout)
	defer cancel()
	res, err := r.h.TrialBoot(ctx, backend)
	if err != nil {
		c.Status = StatusFail
		c.Detail = "the guest did not come up: " + err.Error()
		c.Fix = "run `cowork-vmm run --debug -- true` to see the guest's log"
		if backend == BackendKVM {
			c.Fix += "; meanwhile " + processHint
		}
		return false
	}
	c.Status = StatusOK
	c.Detail = fmt.Sprintf("guest agent said hello after %.2f s", res.Elapsed.Seconds())
	if res.Kernel != "" {
		c.Detail += " (guest kernel " + res.Kernel + ")"
	}
	if res.Memory != "" {
		c.Detail += "; " + res.Memory
	}
	return true
}
