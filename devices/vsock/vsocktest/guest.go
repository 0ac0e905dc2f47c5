package vsocktest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
)

// Options shape the guest. The zero value is a Linux-like guest.
type Options struct {
	// BufAlloc is the receive buffer each guest connection advertises.
	// Default 256 KiB (Linux's default).
	BufAlloc uint32
	// RxBuffers is how many rx buffers stay posted. Default 64.
	RxBuffers int
	// RxBufferSize is the payload room of each rx buffer. Default 4096.
	RxBufferSize uint32
	// SplitRxHeader posts each rx buffer as two descriptors, 44 bytes for
	// the header and RxBufferSize for the payload (Linux before 6.2);
	// otherwise one descriptor holds both (Linux 6.2 and later).
	SplitRxHeader bool
	// CombinedTx writes a packet's header and payload in one descriptor;
	// otherwise the header has its own (as Linux does).
	CombinedTx bool
	// MemSize is the guest memory size. Default 64 MiB.
	MemSize int
}

// Guest is a running guest: a virtio driver bound to the device, a pump
// goroutine delivering rx packets to the Stack, and the Stack itself.
type Guest struct {
	*Stack
	Driver *virtiotest.Driver

	opts   Options
	rx, tx *virtiotest.DriverQueue
	txMu   sync.Mutex // serialises tx adds and used-ring reclaim

	stop chan struct{}
	done chan struct{}

	errMu sync.Mutex
	errs  []string // driver-level problems (bad used elements)
}

// Start activates dev as a guest with cid (read from the config space and
// checked) would, and runs the guest until the test ends.
func Start(tb testing.TB, dev *vsock.Device, opts Options) *Guest {
	tb.Helper()
	if opts.BufAlloc == 0 {
		opts.BufAlloc = 256 << 10
	}
	if opts.RxBuffers <= 0 {
		opts.RxBuffers = 64
	}
	if opts.RxBufferSize == 0 {
		opts.RxBufferSize = 4096
	}
	if opts.MemSize <= 0 {
		opts.MemSize = 64 << 20
	}
	drv := virtiotest.Start(tb, dev, virtiotest.Options{MemSize: opts.MemSize})
	var raw [8]byte
	drv.ReadConfig(0, raw[:])
	cid := uint64(raw[0]) | uint64(raw[1])<<8 | uint64(raw[2])<<16 | uint64(raw[3])<<24 |
		uint64(raw[4])<<32 | uint64(raw[5])<<40 | uint64(raw[6])<<48 | uint64(raw[7])<<56
	if cid != dev.GuestCID() {
		tb.Fatalf("vsocktest: config space guest_cid %d, device says %d", cid, dev.GuestCID())
	}
	g := &Guest{
		Driver: drv,
		opts:   opts,
		rx:     drv.Queue(0),
		tx:     drv.Queue(1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if g.rx == nil || g.tx == nil {
		tb.Fatalf("vsocktest: rx or tx queue not set up")
	}
	g.Stack = NewStack(cid, opts.BufAlloc, g.send)
	for range opts.RxBuffers {
		if err := g.postRx(); err != nil {
			tb.Fatalf("vsocktest: posting rx buffers: %v", err)
		}
	}
	g.rx.Kick()
	go g.pump()
	tb.Cleanup(g.Stop)
	return g
}

// Stop ends the pump goroutine. The device keeps running until the driver
// resets it (virtiotest does at the end of the test).
func (g *Guest) Stop() {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	<-g.done
}

// Errors returns driver-level problems seen so far, together with the
// Stack's protocol violations.
func (g *Guest) Errors() []string {
	g.errMu.Lock()
	defer g.errMu.Unlock()
	return append(append([]string(nil), g.errs...), g.Violations()...)
}

func (g *Guest) fail(format string, args ...any) {
	g.errMu.Lock()
	defer g.errMu.Unlock()
	if len(g.errs) < 100 {
		g.errs = append(g.errs, fmt.Sprintf(format, args...))
	}
}

func (g *Guest) postRx() error {
	if g.opts.SplitRxHeader {
		_, err := g.rx.Add(virtiotest.Writable(vsock.HeaderSize), virtiotest.Writable(g.opts.RxBufferSize))
		return err
	}
	_, err := g.rx.Add(virtiotest.Writable(vsock.HeaderSize + g.opts.RxBufferSize))
	return err
}

// pump delivers every packet the device returns on the rx queue, reposting
// a buffer for each.
func (g *Guest) pump() {
	defer close(g.done)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		got := false
		for {
			u, ok, err := g.rx.Poll()
			if err != nil {
				g.fail("rx used ring: %v", err)
			}
			if !ok {
				break
			}
			got = true
			g.deliver(u)
			if err := g.postRx(); err != nil {
				g.fail("reposting an rx buffer: %v", err)
			}
		}
		if got {
			g.rx.Kick()
			continue
		}
		select {
		case <-g.stop:
			return
		case <-g.Driver.IRQ.C():
			g.Driver.AckInterrupts()
		case <-tick.C:
		}
	}
}

func (g *Guest) deliver(u virtiotest.Used) {
	if len(u.Data) < vsock.HeaderSize {
		g.fail("rx buffer returned with %d bytes, less than a header", len(u.Data))
		return
	}
	h, _ := vsock.DecodeHeader(u.Data)
	payload := u.Data[vsock.HeaderSize:]
	if int(h.Len) > len(payload) {
		g.fail("rx packet %s: len beyond the %d bytes used", h.String(), len(payload))
		return
	}
	if max := g.opts.RxBufferSize; h.Len > max {
		g.fail("rx packet %s: len beyond the buffer's %d bytes", h.String(), max)
	}
	g.Stack.Deliver(h, payload[:h.Len])
}

// send posts one packet on the tx queue and kicks, waiting for room.
func (g *Guest) send(h vsock.Header, data []byte) error {
	hdr := h.Bytes()
	var bufs []virtiotest.Buffer
	if g.opts.CombinedTx || len(data) == 0 {
		bufs = []virtiotest.Buffer{{Data: append(hdr, data...)}}
	} else {
		bufs = []virtiotest.Buffer{{Data: hdr}, {Data: append([]byte(nil), data...)}}
	}
	return g.SendRaw(bufs...)
}

// SendRaw posts one tx chain made of bufs, as a hostile guest may, and
// kicks. It waits (up to Timeout) while the tx queue is full.
func (g *Guest) SendRaw(bufs ...virtiotest.Buffer) error {
	deadline := time.Now().Add(Timeout)
	for {
		g.txMu.Lock()
		g.reclaimTxLocked()
		var err error
		if g.tx.FreeDescriptors() >= len(bufs) {
			_, err = g.tx.Add(bufs...)
			if err == nil {
				g.txMu.Unlock()
				g.tx.Kick()
				return nil
			}
		}
		g.txMu.Unlock()
		if time.Now().After(deadline) {
			return fmt.Errorf("vsocktest: tx queue full for %v: %w", Timeout, errors.Join(err, errGuestTimeout))
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// reclaimTxLocked collects used tx chains. The device never writes into a
// tx chain, so a nonzero used length is recorded as an error.
func (g *Guest) reclaimTxLocked() {
	for {
		u, ok, err := g.tx.Poll()
		if err != nil {
			g.fail("tx used ring: %v", err)
		}
		if !ok {
			return
		}
		if u.Len != 0 {
			g.fail("tx chain %d returned with used length %d, want 0", u.Head, u.Len)
		}
	}
}

// WaitTxDrained waits until the device has returned every tx chain.
func (g *Guest) WaitTxDrained(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		g.txMu.Lock()
		g.reclaimTxLocked()
		n := g.tx.InFlight()
		g.txMu.Unlock()
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vsocktest: %d tx chains still with the device: %w", n, errGuestTimeout)
		}
		time.Sleep(100 * time.Microsecond)
	}
}
