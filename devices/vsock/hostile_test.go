package vsock_test

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock/vsocktest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

func guestHeader(op uint16, srcPort, dstPort uint32) vsock.Header {
	return vsock.Header{
		SrcCID: testCID, DstCID: vsock.HostCID, SrcPort: srcPort, DstPort: dstPort,
		Type: vsock.TypeStream, Op: op, BufAlloc: 64 << 10,
	}
}

// waitRSTs waits until the guest has received n RSTs in total.
func waitRSTs(t *testing.T, g *vsocktest.Guest, n int) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for g.Received(vsock.OpRST) < n {
		if time.Now().After(deadline) {
			t.Fatalf("guest received %d RSTs, want %d", g.Received(vsock.OpRST), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMalformedPackets sends bad tx chains, each followed by a probe (a
// REQUEST to a port nobody listens on): the probe's RST proves the device
// dropped the bad packet and kept draining; the guest checks every tx
// chain came back with used length 0.
func TestMalformedPackets(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{})
	valid := guestHeader(vsock.OpRW, 3000, 1024)
	valid.Len = 4
	with := func(f func(h *vsock.Header)) []byte {
		h := valid
		f(&h)
		return h.Bytes()
	}
	cases := []struct {
		name string
		bufs []virtiotest.Buffer
	}{
		{"short header", []virtiotest.Buffer{virtiotest.Readable(valid.Bytes()[:20])}},
		{"len beyond max", []virtiotest.Buffer{virtiotest.Readable(with(func(h *vsock.Header) { h.Len = 1 << 20 }))}},
		{"len beyond chain", []virtiotest.Buffer{virtiotest.Readable(append(valid.Bytes(), 1, 2))}},
		{"bad op", []virtiotest.Buffer{virtiotest.Readable(with(func(h *vsock.Header) { h.Op = 99; h.Len = 0 }))}},
		{"op zero", []virtiotest.Buffer{virtiotest.Readable(with(func(h *vsock.Header) { h.Op = 0; h.Len = 0 }))}},
		{"bad type", []virtiotest.Buffer{virtiotest.Readable(with(func(h *vsock.Header) { h.Type = 2 }))}},
		{"src cid not the guest", []virtiotest.Buffer{virtiotest.Readable(with(func(h *vsock.Header) { h.SrcCID = 3 }))}},
		{"src cid of the host", []virtiotest.Buffer{virtiotest.Readable(with(func(h *vsock.Header) { h.SrcCID = vsock.HostCID }))}},
		{"dst cid not the host", []virtiotest.Buffer{virtiotest.Readable(with(func(h *vsock.Header) { h.DstCID = testCID }))}},
		{"payload on REQUEST", []virtiotest.Buffer{virtiotest.Readable(append(with(func(h *vsock.Header) { h.Op = vsock.OpRequest }), 1, 2, 3, 4))}},
		{"bad shutdown flags", []virtiotest.Buffer{virtiotest.Readable(with(func(h *vsock.Header) { h.Op = vsock.OpShutdown; h.Len = 0; h.Flags = 8 }))}},
		{"writable only", []virtiotest.Buffer{virtiotest.Writable(64)}},
		{"header then writable", []virtiotest.Buffer{virtiotest.Readable(valid.Bytes()), virtiotest.Writable(4)}},
	}
	rsts := 0
	for i, tc := range cases {
		if err := g.SendRaw(tc.bufs...); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		probe := guestHeader(vsock.OpRequest, 4000+uint32(i), 9999)
		if err := g.SendRaw(virtiotest.Readable(probe.Bytes())); err != nil {
			t.Fatal(err)
		}
		rsts++
		waitRSTs(t, g, rsts)
	}
	if err := g.WaitTxDrained(waitLimit); err != nil {
		t.Fatal(err)
	}
	if got := g.Received(vsock.OpRST); got != rsts {
		t.Fatalf("guest received %d RSTs, want %d (a bad packet was answered?)", got, rsts)
	}
}

// TestHeaderLayouts checks that the device reads a header split across
// descriptors, and a header sharing its descriptor with the payload.
func TestHeaderLayouts(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	l, _ := d.Listen(1024)
	defer l.Close()
	accepted := acceptOne(t, l)
	g := startGuest(t, d, vsocktest.Options{})

	g.Prepare(3000, 1024)
	req := guestHeader(vsock.OpRequest, 3000, 1024).Bytes()
	// Split 7/30/7 over three descriptors.
	if err := g.SendRaw(virtiotest.Readable(req[:7]), virtiotest.Readable(req[7:37]), virtiotest.Readable(req[37:])); err != nil {
		t.Fatal(err)
	}
	hc := recvConn(t, accepted)

	rw := guestHeader(vsock.OpRW, 3000, 1024)
	rw.Len = 10
	// Header and the first payload bytes in one descriptor, the rest in two more.
	pkt := append(rw.Bytes(), []byte("0123456789")...)
	if err := g.SendRaw(virtiotest.Readable(pkt[:47]), virtiotest.Readable(pkt[47:50]), virtiotest.Readable(pkt[50:])); err != nil {
		t.Fatal(err)
	}
	// Header and payload in one descriptor.
	rw.Len = 3
	if err := g.SendRaw(virtiotest.Readable(append(rw.Bytes(), "abc"...))); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, hc, 13); string(got) != "0123456789abc" {
		t.Fatalf("host read %q", got)
	}
}

// TestGuestOverrunningCreditIsReset has the guest ignore the host's
// buf_alloc: the connection is reset rather than buffering without bound.
func TestGuestOverrunningCreditIsReset(t *testing.T) {
	d := newDevice(t, vsock.Config{BufferSize: 8 << 10})
	l, _ := d.Listen(1024)
	defer l.Close()
	accepted := acceptOne(t, l)
	g := startGuest(t, d, vsocktest.Options{})
	gc, err := g.Dial(1024, waitLimit)
	if err != nil {
		t.Fatal(err)
	}
	hc := recvConn(t, accepted)
	rw := guestHeader(vsock.OpRW, gc.LocalPort(), 1024)
	rw.Len = 4 << 10
	for range 3 { // 12 KiB into an 8 KiB buffer nobody reads
		if err := g.SendRaw(virtiotest.Readable(append(rw.Bytes(), make([]byte, rw.Len)...))); err != nil {
			t.Fatal(err)
		}
	}
	if err := gc.WaitReset(waitLimit); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16<<10)
	total := 0
	for {
		n, err := hc.Read(buf)
		total += n
		if err != nil {
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("host Read after reset = %v, want ECONNRESET", err)
			}
			break
		}
	}
	if total != 8<<10 {
		t.Fatalf("host read %d bytes before the reset error, want the 8 KiB within credit", total)
	}
}

func TestConnectionLimitAndBacklog(t *testing.T) {
	d := newDevice(t, vsock.Config{MaxConnections: 3, AcceptBacklog: 2})
	l, _ := d.Listen(1024)
	g := startGuest(t, d, vsocktest.Options{})
	// Backlog 2: two connects succeed without Accept, the third is refused.
	for i := range 2 {
		if _, err := g.Dial(1024, waitLimit); err != nil {
			t.Fatalf("connect %d: %v", i, err)
		}
	}
	if _, err := g.Dial(1024, waitLimit); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect beyond the backlog = %v, want refused", err)
	}
	for range 2 {
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// Three connections max: one more fits, then refusals.
	if _, err := g.Dial(1024, waitLimit); err != nil {
		t.Fatalf("third connection: %v", err)
	}
	if _, err := g.Dial(1024, waitLimit); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect beyond the connection limit = %v, want refused", err)
	}
	if _, err := d.Dial(context.Background(), 5000); err == nil {
		t.Fatal("host Dial beyond the connection limit succeeded")
	}
	// Closing the listener resets the connection still in its backlog.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v", err)
	}
	if _, err := d.Listen(1024); err != nil {
		t.Fatalf("Listen after Close: %v", err)
	}
	if _, err := d.Listen(1024); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("second Listen = %v, want EADDRINUSE", err)
	}
}

func TestDeviceResetEndsConnections(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{})
	hc, _ := hostDialsGuest(t, d, g, 5000)
	g.Stop()
	g.Driver.Reset()
	if _, err := hc.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Read after device reset = %v, want ECONNRESET", err)
	}
	if _, err := d.Dial(context.Background(), 5000); !errors.Is(err, vsock.ErrNotActive) {
		t.Fatalf("Dial after device reset = %v, want ErrNotActive", err)
	}
}

// TestDeviceResetDeliversSentData: what the guest sent before it reset
// the device reaches the host's end of the connection ahead of the reset,
// also when the device had not yet been woken for it (a guest agent that
// answers and powers off at once: its reply was in the tx queue when the
// guest's shutdown reset the device).
func TestDeviceResetDeliversSentData(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{})
	hc, _ := hostDialsGuest(t, d, g, 5000)
	g.Stop()
	rw := guestHeader(vsock.OpRW, 5000, hc.LocalAddr().(vsock.Addr).Port)
	rw.Len = uint32(len("reply"))
	if _, err := g.Driver.Queue(1).Add(virtiotest.Readable(append(rw.Bytes(), "reply"...))); err != nil {
		t.Fatal(err)
	}
	g.Driver.Reset() // no kick came before it
	got, err := io.ReadAll(hc)
	if string(got) != "reply" || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the host read %q, then %v; want the reply, then ECONNRESET", got, err)
	}
}

func TestRSTForRWOnUnknownConnection(t *testing.T) {
	d := newDevice(t, vsock.Config{})
	g := startGuest(t, d, vsocktest.Options{})
	rw := guestHeader(vsock.OpRW, 3000, 1024)
	rw.Len = 1
	if err := g.SendRaw(virtiotest.Readable(append(rw.Bytes(), 'x'))); err != nil {
		t.Fatal(err)
	}
	waitRSTs(t, g, 1)
	// An RST is never answered.
	rst := guestHeader(vsock.OpRST, 3001, 1024)
	if err := g.SendRaw(virtiotest.Readable(rst.Bytes())); err != nil {
		t.Fatal(err)
	}
	probe := guestHeader(vsock.OpCreditRequest, 3002, 1024)
	if err := g.SendRaw(virtiotest.Readable(probe.Bytes())); err != nil {
		t.Fatal(err)
	}
	waitRSTs(t, g, 2)
	time.Sleep(10 * time.Millisecond)
	if n := g.Received(vsock.OpRST); n != 2 {
		t.Fatalf("guest received %d RSTs, want 2", n)
	}
}

func TestBadPacketsAreLoggedRateLimited(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	d := newDevice(t, vsock.Config{Logger: logs.Logger()})
	g := startGuest(t, d, vsocktest.Options{})
	bad := guestHeader(vsock.OpRW, 3000, 1024)
	bad.Op = 99
	for range 3 * ratelog.DefaultBurst {
		if err := g.SendRaw(virtiotest.Readable(bad.Bytes())); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.WaitTxDrained(waitLimit); err != nil {
		t.Fatal(err)
	}
	if lines := logs.Lines("vsock: dropping a bad packet from the guest"); len(lines) != ratelog.DefaultBurst {
		t.Fatalf("%d lines for %d bad packets, want %d:\n%s", len(lines), 3*ratelog.DefaultBurst, ratelog.DefaultBurst, logs.String())
	}
}
