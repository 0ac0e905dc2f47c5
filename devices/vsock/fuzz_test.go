package vsock_test

import (
	"io"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock/vsocktest"
)

func FuzzPacket(f *testing.F) {
	for op := vsock.OpRequest; op <= vsock.OpCreditRequest; op++ {
		h := guestHeader(op, 3000, 1024)
		if op == vsock.OpRW {
			h.Len = 100
		}
		f.Add(h.Bytes())
	}
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := vsock.DecodeHeader(b)
		if len(b) < vsock.HeaderSize {
			if err == nil {
				t.Fatalf("decoded a %d-byte header", len(b))
			}
			return
		}
		if err != nil {
			t.Fatalf("DecodeHeader(%d bytes): %v", len(b), err)
		}
		if got := h.Bytes(); string(got) != string(b[:vsock.HeaderSize]) {
			t.Fatalf("re-encoding changed the header: %x != %x", got, b[:vsock.HeaderSize])
		}
		_ = h.String()
		if h.Validate(testCID) != nil {
			return
		}
		// What Validate accepts is safe to act on.
		switch {
		case h.Len > vsock.MaxPacketData:
			t.Fatalf("accepted len %d", h.Len)
		case h.Type != vsock.TypeStream, h.Op < vsock.OpRequest, h.Op > vsock.OpCreditRequest:
			t.Fatalf("accepted type %d op %d", h.Type, h.Op)
		case h.SrcCID != testCID, h.DstCID != vsock.HostCID:
			t.Fatalf("accepted cids %d -> %d", h.SrcCID, h.DstCID)
		case h.Len != 0 && h.Op != vsock.OpRW:
			t.Fatalf("accepted a payload on op %d", h.Op)
		}
	})
}

// FuzzDevice feeds random tx chains through the device while a host
// listener echoes, then checks the device still drains its tx queue and
// answers a probe, returned every chain with used length 0, and sent the
// guest only well-formed packets.
//
// Input format, repeated: a control byte c, then for each of (c&3)+1
// descriptors a length byte L and L bytes of content. c's upper bits fix up
// the first descriptor's header so the fuzzer reaches deep states: bit 2
// sets valid CIDs and type, bit 3 folds op into 1..7, bit 4 aims at the
// listener (port 1024), bit 5 folds the source port into 8 values, bit 6
// sets len to the bytes that follow.
func FuzzDevice(f *testing.F) {
	req := guestHeader(vsock.OpRequest, 3000, 1024).Bytes()
	rw := guestHeader(vsock.OpRW, 3000, 1024)
	rw.Len = 5
	f.Add(append(append([]byte{0x00, byte(len(req))}, req...),
		append([]byte{0x01, byte(vsock.HeaderSize)}, append(rw.Bytes(), 5, 'h', 'e', 'l', 'l', 'o')...)...))
	f.Add([]byte{0x7c, 44, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		d := newDevice(t, vsock.Config{BufferSize: 4 << 10, MaxConnections: 8, AcceptBacklog: 4})
		l, err := d.Listen(1024)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
		g := vsocktest.Start(t, d, vsocktest.Options{MemSize: 8 << 20, RxBuffers: 16})
		for chains := 0; len(in) > 0 && chains < 64; chains++ {
			c := in[0]
			in = in[1:]
			var bufs []virtiotest.Buffer
			for range int(c&3) + 1 {
				if len(in) == 0 {
					break
				}
				n := min(int(in[0]), len(in)-1)
				bufs = append(bufs, virtiotest.Readable(in[1:1+n]))
				in = in[1+n:]
			}
			if len(bufs) == 0 || len(bufs[0].Data) == 0 {
				continue
			}
			fixHeader(bufs, c)
			if err := g.SendRaw(bufs...); err != nil {
				t.Fatal(err)
			}
		}
		probe := guestHeader(vsock.OpRequest, 0xfff0_0000, 9999)
		rsts := g.Received(vsock.OpRST)
		if err := g.SendRaw(virtiotest.Readable(probe.Bytes())); err != nil {
			t.Fatal(err)
		}
		waitProbe(t, g, rsts)
		if err := g.WaitTxDrained(waitLimit); err != nil {
			t.Fatal(err)
		}
		for _, e := range g.Errors() {
			t.Errorf("guest saw: %s", e)
		}
	})
}

func waitProbe(t *testing.T, g *vsocktest.Guest, before int) {
	t.Helper()
	// The probe's RST may be preceded by RSTs for the fuzzed packets still
	// in flight; any new RST after the probe was sent proves nothing, so
	// wait for the count to pass what it was, then for tx to drain.
	waitRSTs(t, g, before+1)
}

func fixHeader(bufs []virtiotest.Buffer, c byte) {
	b := bufs[0].Data
	if len(b) < vsock.HeaderSize {
		return
	}
	h, _ := vsock.DecodeHeader(b)
	if c&0x04 != 0 {
		h.SrcCID, h.DstCID, h.Type = testCID, vsock.HostCID, vsock.TypeStream
	}
	if c&0x08 != 0 {
		h.Op = h.Op%7 + 1
	}
	if c&0x10 != 0 {
		h.DstPort = 1024
	}
	if c&0x20 != 0 {
		h.SrcPort = 3000 + h.SrcPort%8
	}
	if c&0x40 != 0 {
		rest := len(b) - vsock.HeaderSize
		for _, buf := range bufs[1:] {
			rest += len(buf.Data)
		}
		h.Len = uint32(rest)
	}
	h.Encode(b)
}
