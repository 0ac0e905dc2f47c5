package virtio_test

import (
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// Several vCPUs hammering the registers and guest memory with random
// values while a device drains its queue: no panic, no deadlock, no race.
func TestMMIOConcurrentRandomAccess(t *testing.T) {
	dev := &drainDevice{probeDevice: *newProbeDevice(8, 8)}
	d := virtiotest.New(dev, virtiotest.Options{MemSize: 64 << 10})
	m := d.MMIO()
	var wg sync.WaitGroup
	for worker := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(worker), 7))
			var b [4]byte
			for range 5000 {
				offset := uint64(r.IntN(0x40)) * 4
				binary.LittleEndian.PutUint32(b[:], r.Uint32()&0x1f)
				switch r.IntN(5) {
				case 0:
					m.Read(offset, b[:])
				case 1, 2:
					m.Write(offset, b[:])
				case 3:
					_ = d.Mem.WriteAt(b[:], uint64(r.IntN(64<<10)))
				case 4:
					// Occasionally a well-behaved driver starts over.
					if r.IntN(50) == 0 {
						_ = d.Init()
					}
				}
			}
		})
	}
	wg.Wait()
	m.Reset()
	if s := m.Status(); s != 0 {
		t.Fatalf("status %#x after reset", s)
	}
}
