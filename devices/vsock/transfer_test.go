package vsock_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock/vsocktest"
)

// pattern is deterministic test data: a pseudo-random block of an odd
// size, repeated, so a lost, duplicated or reordered chunk changes the hash.
type pattern struct {
	seed  uint64
	block []byte
	off   int
}

func (p *pattern) Read(b []byte) (int, error) {
	if p.block == nil {
		p.block = make([]byte, 1<<20+17)
		s := p.seed
		for i := range p.block {
			s = s*6364136223846793005 + 1442695040888963407
			p.block[i] = byte(s >> 56)
		}
	}
	n := 0
	for n < len(b) {
		c := copy(b[n:], p.block[p.off:])
		n += c
		p.off = (p.off + c) % len(p.block)
	}
	return n, nil
}

func transferSize(t *testing.T) int64 {
	if testing.Short() {
		return 4 << 20
	}
	return 64 << 20
}

// TestLargeTransferGuestToHost moves 64 MiB from the guest to the host with
// a small host buffer: it completes only if the guest's credit (which the
// guest stack enforces) is renewed by the host's CREDIT_UPDATEs, and the
// device resets any connection whose guest overruns it.
func TestLargeTransferGuestToHost(t *testing.T) {
	d := newDevice(t, vsock.Config{BufferSize: 32 << 10})
	l, _ := d.Listen(1024)
	defer l.Close()
	accepted := acceptOne(t, l)
	g := startGuest(t, d, vsocktest.Options{CombinedTx: true})
	gc, err := g.Dial(1024, waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	hc := recvConn(t, accepted)

	size := transferSize(t)
	sent := make(chan []byte, 1)
	go func() {
		h := sha256.New()
		_, err := io.Copy(io.MultiWriter(gc, h), io.LimitReader(&pattern{seed: 1}, size))
		if err == nil {
			err = gc.Shutdown(vsock.ShutdownSend)
		}
		if err != nil {
			t.Errorf("guest send: %v", err)
		}
		sent <- h.Sum(nil)
	}()
	h := sha256.New()
	n, err := io.Copy(h, hc)
	if err != nil || n != size {
		t.Fatalf("host received %d bytes, err %v; want %d", n, err, size)
	}
	if want := <-sent; !bytes.Equal(h.Sum(nil), want) {
		t.Fatal("data corrupted in transit")
	}
	if gc.IsReset() {
		t.Fatal("the device reset the connection (credit violation?)")
	}
}

// TestLargeTransferHostToGuest moves 64 MiB from the host to a guest with a
// small receive buffer; the guest stack records a violation whenever the
// host sends beyond the credit it advertised.
func TestLargeTransferHostToGuest(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{BufAlloc: 48 << 10, SplitRxHeader: true})
	hc, gc := hostDialsGuest(t, d, g, 5000)
	size := transferSize(t)
	sent := make(chan []byte, 1)
	go func() {
		h := sha256.New()
		_, err := io.Copy(io.MultiWriter(hc, h), io.LimitReader(&pattern{seed: 2}, size))
		if err == nil {
			err = hc.(*vsock.Conn).CloseWrite()
		}
		if err != nil {
			t.Errorf("host send: %v", err)
		}
		sent <- h.Sum(nil)
	}()
	h := sha256.New()
	n, err := io.Copy(h, gc)
	if err != nil || n != size {
		t.Fatalf("guest received %d bytes, err %v; want %d", n, err, size)
	}
	if want := <-sent; !bytes.Equal(h.Sum(nil), want) {
		t.Fatal("data corrupted in transit")
	}
	if m := gc.MaxBuffered(); m > 48<<10 || m == 0 {
		t.Fatalf("guest buffered up to %d bytes; credit allows 48 KiB", m)
	}
}

func TestDeadlines(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{BufAlloc: 16 << 10})
	hc, gc := hostDialsGuest(t, d, g, 5000)

	// Read with nothing to read.
	hc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := hc.Read(make([]byte, 10))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past deadline = %v, want a timeout", err)
	}
	// An expired deadline fails Read even with data waiting; clearing it
	// makes Read work again.
	if _, err := gc.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	waitBuffered(t, hc, 1)
	if _, err := hc.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past deadline with data waiting = %v, want a timeout", err)
	}
	hc.SetReadDeadline(time.Time{})
	if got := readFull(t, hc, 1); string(got) != "x" {
		t.Fatalf("read %q", got)
	}

	// Write more than the guest's credit while the guest does not read: the
	// write blocks, then times out with a partial count.
	hc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := hc.Write(make([]byte, 1<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write past deadline = %d, %v; want a timeout", n, err)
	}
	if n != 16<<10 {
		// Bytes waiting in the host's tx buffer count against the guest's
		// credit too, so exactly the guest's buf_alloc is accepted.
		t.Fatalf("Write accepted %d bytes before timing out; want the guest's credit, 16 KiB", n)
	}
	// The stalled writer asked the guest for credit once, not in a loop.
	if n := g.Received(vsock.OpCreditRequest); n != 1 {
		t.Errorf("host sent %d CREDIT_REQUESTs while stalled, want 1", n)
	}
	// A pending Read is woken by a deadline set after it started.
	done := make(chan error, 1)
	go func() { _, err := hc.Read(make([]byte, 1)); done <- err }()
	time.Sleep(10 * time.Millisecond)
	hc.SetDeadline(time.Now())
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("pending Read = %v, want a timeout", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("pending Read not woken by SetDeadline")
	}
	// The guest gets exactly what was accepted.
	got := readFull(t, gc, n)
	if !bytes.Equal(got, make([]byte, n)) {
		t.Fatal("guest data differs")
	}
}

func TestCloseMidTransfer(t *testing.T) {
	d := newDevice(t, vsock.Config{CloseTimeout: 100 * time.Millisecond})
	g := startGuest(t, d, vsocktest.Options{BufAlloc: 16 << 10})
	hc, gc := hostDialsGuest(t, d, g, 5000)
	writeErr := make(chan error, 1)
	go func() { _, err := hc.Write(make([]byte, 4<<20)); writeErr <- err }()
	readErr := make(chan error, 1)
	go func() { _, err := hc.Read(make([]byte, 1)); readErr <- err }()
	time.Sleep(20 * time.Millisecond)
	if err := hc.Close(); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan error{"Write": writeErr, "Read": readErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("blocked %s after Close = %v, want net.ErrClosed", name, err)
			}
		case <-time.After(waitLimit):
			t.Fatalf("blocked %s not woken by Close", name)
		}
	}
	// The guest never reads, so the pending data never drains: the close
	// times out and the host resets the connection.
	if err := gc.WaitReset(waitLimit); err != nil {
		t.Fatal(err)
	}
	if err := hc.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close = %v, want net.ErrClosed", err)
	}
}

func TestGuestResetMidTransfer(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{BufAlloc: 16 << 10})
	hc, gc := hostDialsGuest(t, d, g, 5000)
	writeErr := make(chan error, 1)
	go func() { _, err := hc.Write(make([]byte, 4<<20)); writeErr <- err }()
	time.Sleep(20 * time.Millisecond)
	if err := gc.Reset(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-writeErr:
		if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("Write after guest RST = %v, want EPIPE or ECONNRESET", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Write not woken by the guest's RST")
	}
	if _, err := hc.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("Read after guest RST = %v, want EOF", err)
	}
}

func TestCloseTimeoutWhenGuestNeverAnswers(t *testing.T) {
	d := newDevice(t, vsock.Config{CloseTimeout: 50 * time.Millisecond})
	g := startGuest(t, d, vsocktest.Options{})
	g.SetIgnoreShutdown(true)
	hc, gc := hostDialsGuest(t, d, g, 5000)
	hc.Close()
	if err := gc.WaitPeerShutdown(vsock.ShutdownRcv|vsock.ShutdownSend, waitLimit); err != nil {
		t.Fatal(err)
	}
	if err := gc.WaitReset(waitLimit); err != nil {
		t.Fatalf("host never reset a connection whose close the guest ignored: %v", err)
	}
}

// waitBuffered waits until c has n bytes from the guest buffered.
func waitBuffered(t *testing.T, c net.Conn, n int) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for c.(*vsock.Conn).Buffered() < n {
		if time.Now().After(deadline) {
			t.Fatalf("host never buffered %d bytes", n)
		}
		time.Sleep(time.Millisecond)
	}
}
