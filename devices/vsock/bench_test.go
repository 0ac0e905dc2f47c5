package vsock_test

import (
	"io"
	"net"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock/vsocktest"
)

const benchChunk = 64 << 10

// benchPair connects a host Conn and a guest connection through the test
// driver (Linux-sized 4 KiB rx buffers, default credit).
func benchPair(b *testing.B) (net.Conn, *vsocktest.GuestConn) {
	d := newDevice(b, vsock.Config{})
	g := vsocktest.Start(b, d, vsocktest.Options{CombinedTx: true})
	return hostDialsGuest(b, d, g, 5000)
}

func BenchmarkHostToGuest(b *testing.B) {
	hc, gc := benchPair(b)
	total := int64(b.N) * benchChunk
	b.SetBytes(benchChunk)
	b.ResetTimer()
	go func() {
		if _, err := io.CopyN(hc, &pattern{seed: 3}, total); err != nil {
			b.Errorf("host write: %v", err)
		}
	}()
	if n, err := io.CopyN(io.Discard, gc, total); err != nil {
		b.Fatalf("guest read %d of %d: %v", n, total, err)
	}
}

func BenchmarkGuestToHost(b *testing.B) {
	hc, gc := benchPair(b)
	total := int64(b.N) * benchChunk
	b.SetBytes(benchChunk)
	b.ResetTimer()
	go func() {
		if _, err := io.CopyN(gc, &pattern{seed: 4}, total); err != nil {
			b.Errorf("guest write: %v", err)
		}
	}()
	if n, err := io.CopyN(io.Discard, hc, total); err != nil {
		b.Fatalf("host read %d of %d: %v", n, total, err)
	}
}
