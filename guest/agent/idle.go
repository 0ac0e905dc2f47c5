package agent

import (
	"log/slog"
	"os"
	"sync"
	"time"
)

// Memory an idle guest gives back (Options.DropCachesWhenIdle, the VM).
//
// With free page reporting (the VM's virtio-balloon) every page the guest
// kernel frees goes back to the host. Its page cache is not freed by
// itself: the files sessions read — the shared directories' and the
// root disk's — stay cached, in the host's RAM, while no session runs.
// So once the last process has ended and none has started for the delay,
// the agent drops the kernel's clean page cache (drop_caches 1: clean
// pages only; dirty ones of the root disk are written back first by the
// kernel as ever and are never dropped). The host still has those files
// in its own page cache; the next session reads them from there.

// idleDropDelay is how long the VM's agent waits, after its last process
// ended, before it drops the page cache. A session's Claude Code CLI runs
// from the session's first message to its end, its tools as its children,
// so the last process ending means the guest's work is done for now: the
// delay only spares a client that starts another process at once.
const idleDropDelay = 2 * time.Second

// idleDropper calls drop once no process has run for delay. Safe for
// concurrent use.
type idleDropper struct {
	delay time.Duration
	drop  func() error
	log   *slog.Logger

	mu    sync.Mutex
	timer *time.Timer // armed while the table is empty
}

// dropPageCache drops the kernel's clean page cache.
func dropPageCache() error {
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("1\n"), 0)
}

// idle arms the drop: the last process has ended.
func (d *idleDropper) idle() { d.arm(true) }

// busy disarms it: a process has started (or the agent is ending).
func (d *idleDropper) busy() { d.arm(false) }

// arm stops the pending drop, if any, and with armed starts another.
func (d *idleDropper) arm(armed bool) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if armed {
		d.timer = time.AfterFunc(d.delay, d.dropNow)
	}
}

// dropNow drops the page cache, logging the outcome.
func (d *idleDropper) dropNow() {
	if err := d.drop(); err != nil {
		d.log.Warn("dropping the idle guest's page cache", "err", err)
		return
	}
	d.log.Info("idle: dropped the guest's clean page cache", "after", d.delay)
}
