package vsock_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock/vsocktest"
)

const (
	testCID   = 42
	waitLimit = 10 * time.Second
)

func newDevice(t testing.TB, cfg vsock.Config) *vsock.Device {
	t.Helper()
	if cfg.GuestCID == 0 {
		cfg.GuestCID = testCID
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := vsock.New(cfg)
	if err != nil {
		t.Fatalf("vsock.New: %v", err)
	}
	return d
}

// startGuest starts a guest and, when the test ends, fails it if the host
// broke the protocol.
func startGuest(t *testing.T, d *vsock.Device, opts vsocktest.Options) *vsocktest.Guest {
	t.Helper()
	g := vsocktest.Start(t, d, opts)
	t.Cleanup(func() {
		for _, e := range g.Errors() {
			t.Errorf("guest saw: %s", e)
		}
	})
	return g
}

// hostDialsGuest has the host dial port in the guest g, which listens and
// accepts, and returns both ends; the host's is closed when the test ends
// (a no-op for one the test closed itself).
func hostDialsGuest(t testing.TB, d *vsock.Device, g *vsocktest.Guest, port uint32) (net.Conn, *vsocktest.GuestConn) {
	t.Helper()
	gl := g.Listen(port)
	hc, err := d.Dial(context.Background(), port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hc.Close() })
	gc, err := gl.Accept(waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	return hc, gc
}

func acceptOne(t *testing.T, l net.Listener) <-chan net.Conn {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Errorf("Accept: %v", err)
			close(ch)
			return
		}
		ch <- c
	}()
	return ch
}

func recvConn(t *testing.T, ch <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c, ok := <-ch:
		if !ok {
			t.Fatal("no connection accepted")
		}
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(waitLimit):
		t.Fatal("timed out waiting for Accept")
	}
	return nil
}

func readFull(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return buf
}

func TestNewRefusesReservedCIDs(t *testing.T) {
	for _, cid := range []uint64{0, 1, 2, 1<<32 - 1, 1 << 40} {
		if _, err := vsock.New(vsock.Config{GuestCID: cid}); err == nil {
			t.Errorf("New accepted guest CID %d", cid)
		}
	}
}

func TestGuestDialsHostListenerAndEchoes(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	l, err := d.Listen(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got, want := l.Addr().String(), "host(2):1024"; got != want {
		t.Errorf("listener Addr = %q, want %q", got, want)
	}
	accepted := acceptOne(t, l)
	g := startGuest(t, d, vsocktest.Options{})

	gc, err := g.Dial(1024, waitLimit)
	if err != nil {
		t.Fatalf("guest dial: %v", err)
	}
	hc := recvConn(t, accepted)
	if a := hc.RemoteAddr().(vsock.Addr); a.CID != testCID || a.Port != gc.LocalPort() || a.Network() != "vsock" {
		t.Errorf("RemoteAddr = %+v, want CID %d port %d", a, testCID, gc.LocalPort())
	}
	if a := hc.LocalAddr().(vsock.Addr); a.CID != vsock.HostCID || a.Port != 1024 {
		t.Errorf("LocalAddr = %+v", a)
	}
	echoed := make(chan error, 1)
	go func() { _, err := io.Copy(hc, hc); echoed <- err }()

	msg := []byte("hello from the guest")
	if _, err := gc.Write(msg); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, gc, len(msg)); !bytes.Equal(got, msg) {
		t.Fatalf("echo = %q, want %q", got, msg)
	}
	// The guest closes: the host's io.Copy sees EOF, and the guest gets
	// the RST that completes its close.
	if err := gc.Close(); err != nil {
		t.Fatalf("guest close: %v", err)
	}
	select {
	case err := <-echoed:
		if err != nil {
			t.Fatalf("io.Copy ended with %v, want nil (EOF)", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("host io.Copy did not end after the guest closed")
	}
}

func TestHostDialsGuestPort(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{})
	hc, gc := hostDialsGuest(t, d, g, 5000)
	if a := hc.RemoteAddr().(vsock.Addr); a.CID != testCID || a.Port != 5000 {
		t.Errorf("RemoteAddr = %+v", a)
	}
	if _, err := hc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, gc, 4); string(got) != "ping" {
		t.Fatalf("guest read %q", got)
	}
	if _, err := gc.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, hc, 4); string(got) != "pong" {
		t.Fatalf("host read %q", got)
	}
	// Host Close: the guest sees SHUTDOWN(both) and answers RST.
	if err := hc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gc.WaitReset(waitLimit); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close = %v, want net.ErrClosed", err)
	}
}

func TestDialRefusedWhenGuestDoesNotListen(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	if _, err := d.Dial(context.Background(), 7000); !errors.Is(err, vsock.ErrNotActive) {
		t.Fatalf("Dial before activation = %v, want ErrNotActive", err)
	}
	startGuest(t, d, vsocktest.Options{})
	_, err := d.Dial(context.Background(), 7000)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Dial = %v, want ECONNREFUSED", err)
	}
}

func TestGuestDialToUnknownPortGetsRST(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{})
	if _, err := g.Dial(4444, waitLimit); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("guest dial = %v, want refused", err)
	}
	if n := g.Received(vsock.OpRST); n != 1 {
		t.Fatalf("guest received %d RSTs, want 1", n)
	}
}

func TestGuestHalfClose(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	l, _ := d.Listen(1024)
	defer l.Close()
	accepted := acceptOne(t, l)
	g := startGuest(t, d, vsocktest.Options{})
	gc, err := g.Dial(1024, waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	hc := recvConn(t, accepted)

	if _, err := gc.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := gc.Shutdown(vsock.ShutdownSend); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(hc)
	if err != nil || string(got) != "request" {
		t.Fatalf("host ReadAll = %q, %v; want \"request\", nil", got, err)
	}
	// The host can still answer.
	if _, err := hc.Write([]byte("response")); err != nil {
		t.Fatalf("host write after the guest's SHUT_WR: %v", err)
	}
	if got := readFull(t, gc, 8); string(got) != "response" {
		t.Fatalf("guest read %q", got)
	}
	if err := hc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gc.WaitReset(waitLimit); err != nil {
		t.Fatal(err)
	}
}

func TestHostHalfClose(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{})
	c, gc := hostDialsGuest(t, d, g, 5001)
	hc := c.(*vsock.Conn)
	if _, err := hc.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	if err := hc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.Write([]byte("more")); !errors.Is(err, syscall.EPIPE) {
		t.Errorf("Write after CloseWrite = %v, want EPIPE", err)
	}
	got, err := io.ReadAll(gc)
	if err != nil || string(got) != "data" {
		t.Fatalf("guest ReadAll = %q, %v", got, err)
	}
	if _, err := gc.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, hc, 5); string(got) != "reply" {
		t.Fatalf("host read %q", got)
	}
	// The guest closes; the host reads EOF and the guest gets its RST.
	if err := gc.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := hc.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("host Read after guest close = %d, %v; want 0, EOF", n, err)
	}
}

func TestGuestShutdownRcvFailsHostWrites(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{})
	hc, gc := hostDialsGuest(t, d, g, 5000)
	if err := gc.Shutdown(vsock.ShutdownRcv); err != nil {
		t.Fatal(err)
	}
	// The guest can still send.
	if _, err := gc.Write([]byte("still talking")); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, hc, 13); string(got) != "still talking" {
		t.Fatalf("host read %q", got)
	}
	// The SHUTDOWN came before the data, so writes now fail.
	if _, err := hc.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Write after the guest's SHUT_RD = %v, want EPIPE", err)
	}
}

func TestCreditRequestIsAnswered(t *testing.T) {
	d := newDevice(t, vsock.Config{BufferSize: 12345})
	l, _ := d.Listen(1024)
	defer l.Close()
	accepted := acceptOne(t, l)
	g := startGuest(t, d, vsocktest.Options{})
	gc, err := g.Dial(1024, waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	recvConn(t, accepted)
	before := g.Received(vsock.OpCreditUpdate)
	req := guestHeader(vsock.OpCreditRequest, gc.LocalPort(), 1024)
	if err := g.SendRaw(virtiotest.Readable(req.Bytes())); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitLimit)
	for g.Received(vsock.OpCreditUpdate) == before {
		if time.Now().After(deadline) {
			t.Fatal("no CREDIT_UPDATE answered the CREDIT_REQUEST")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDialTimesOutWhenGuestIsSilent(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{RxBuffers: 1})
	g.Stop() // nobody reposts rx buffers or answers
	// Use up the one rx buffer so the REQUEST cannot be delivered.
	rw := guestHeader(vsock.OpRW, 3000, 1)
	if err := g.SendRaw(virtiotest.Readable(rw.Bytes())); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := d.Dial(ctx, 5000)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial to a silent guest = %v, want context.DeadlineExceeded", err)
	}
}
