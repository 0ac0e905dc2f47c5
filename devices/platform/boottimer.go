package platform

import (
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// BootTimerPortCount is how many ports the boot timer decodes, from
// guesthost.BootTimerPort.
const BootTimerPortCount = 1

// BootTimer records the time from the VM's start to the guest's first
// write of guesthost.BootTimerMagic. Safe for concurrent use.
type BootTimer struct {
	start time.Time

	once    sync.Once
	mu      sync.Mutex
	elapsed time.Duration
	done    chan struct{}
	onBoot  func(time.Duration)
}

// NewBootTimer returns a timer counting from start (the VMM's start of the
// VM). onBoot, if not nil, is called once, on the vCPU thread that wrote
// the magic value, with the elapsed time; it must not block.
func NewBootTimer(start time.Time, onBoot func(time.Duration)) *BootTimer {
	return &BootTimer{start: start, done: make(chan struct{}), onBoot: onBoot}
}

// Read implements the bus device read: the port reads as zero.
func (b *BootTimer) Read(offset uint64, data []byte) { clear(data) }

// Write implements the bus device write. Only the first write of
// guesthost.BootTimerMagic at offset 0 counts; anything else is ignored.
func (b *BootTimer) Write(offset uint64, data []byte) {
	if offset != 0 || len(data) == 0 || data[0] != guesthost.BootTimerMagic {
		return
	}
	b.once.Do(func() {
		elapsed := time.Since(b.start)
		b.mu.Lock()
		b.elapsed = elapsed
		b.mu.Unlock()
		close(b.done)
		if b.onBoot != nil {
			b.onBoot(elapsed)
		}
	})
}

// Elapsed returns the recorded boot time, and false until the guest wrote
// the magic value.
func (b *BootTimer) Elapsed() (time.Duration, bool) {
	select {
	case <-b.done:
	default:
		return 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.elapsed, true
}

// Done is closed when the boot time is recorded.
func (b *BootTimer) Done() <-chan struct{} { return b.done }
