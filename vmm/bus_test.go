package vmm

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// recorder is a test device that records accesses and answers reads with
// a fixed pattern.
type recorder struct {
	mu     sync.Mutex
	writes []access
	reads  []access
	answer byte
}

type access struct {
	offset uint64
	data   []byte
}

func (r *recorder) Read(offset uint64, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range data {
		data[i] = r.answer + byte(i)
	}
	r.reads = append(r.reads, access{offset, append([]byte(nil), data...)})
}

func (r *recorder) Write(offset uint64, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, access{offset, append([]byte(nil), data...)})
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestBusRefusesOverlapsAndBadRanges(t *testing.T) {
	b := NewPIOBus(quietLogger())
	d := &recorder{}
	if err := b.Register(0x3f8, 8, d); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(0x60, 1, d); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ base, size uint64 }{
		{0x3f8, 8}, {0x3f0, 9}, {0x3ff, 1}, {0x3f9, 1}, {0x3f0, 0x100}, {0x60, 1}, {0x5f, 2},
		{0x100, 0}, {^uint64(0), 2},
	} {
		if err := b.Register(c.base, c.size, d); err == nil {
			t.Errorf("Register(%#x, %#x) accepted", c.base, c.size)
		}
	}
	if err := b.Register(0x400, 1, nil); err == nil {
		t.Error("nil device accepted")
	}
	// Adjacent ranges are fine.
	if err := b.Register(0x3f0, 8, d); err != nil {
		t.Errorf("adjacent below: %v", err)
	}
	if err := b.Register(0x400, 8, d); err != nil {
		t.Errorf("adjacent above: %v", err)
	}
}

func TestBusDispatchesWithRelativeOffsets(t *testing.T) {
	b := NewMMIOBus(quietLogger())
	d1, d2 := &recorder{answer: 0x10}, &recorder{answer: 0x80}
	if err := b.Register(0xd000_1000, 0x1000, d2); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(0xd000_0000, 0x1000, d1); err != nil {
		t.Fatal(err)
	}
	b.Write(0xd000_0070, []byte{1, 2, 3, 4})
	b.Write(0xd000_1004, []byte{9})
	buf := make([]byte, 4)
	b.Read(0xd000_1ffc, buf)
	if len(d1.writes) != 1 || d1.writes[0].offset != 0x70 || !bytes.Equal(d1.writes[0].data, []byte{1, 2, 3, 4}) {
		t.Errorf("d1 writes %+v", d1.writes)
	}
	if len(d2.writes) != 1 || d2.writes[0].offset != 4 {
		t.Errorf("d2 writes %+v", d2.writes)
	}
	if len(d2.reads) != 1 || d2.reads[0].offset != 0xffc || !bytes.Equal(buf, []byte{0x80, 0x81, 0x82, 0x83}) {
		t.Errorf("d2 reads %+v buf % x", d2.reads, buf)
	}
}

func TestBusUnclaimedAccesses(t *testing.T) {
	pio, mmio := NewPIOBus(quietLogger()), NewMMIOBus(quietLogger())
	d := &recorder{}
	if err := pio.Register(0x10, 2, d); err != nil {
		t.Fatal(err)
	}
	if err := mmio.Register(0x1000, 0x10, d); err != nil {
		t.Fatal(err)
	}
	buf := []byte{1, 2, 3, 4}
	pio.Read(0x80, buf)
	if !bytes.Equal(buf, []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("unclaimed port read % x, want all-ones", buf)
	}
	// An access straddling the end of a device is not the device's.
	pio.Read(0x11, buf)
	if !bytes.Equal(buf, []byte{0xff, 0xff, 0xff, 0xff}) || len(d.reads) != 0 {
		t.Errorf("straddling read % x, device reads %d", buf, len(d.reads))
	}
	buf = []byte{1, 2, 3, 4, 5, 6, 7, 8}
	mmio.Read(0x100c, buf)
	if !bytes.Equal(buf, make([]byte, 8)) || len(d.reads) != 0 {
		t.Errorf("unclaimed MMIO read % x, device reads %d", buf, len(d.reads))
	}
	mmio.Write(0x0, buf)
	pio.Write(0xffff, buf[:1])
	if len(d.writes) != 0 {
		t.Errorf("unclaimed writes reached the device: %+v", d.writes)
	}
}

func TestBusConcurrentUse(t *testing.T) {
	b := NewPIOBus(quietLogger())
	d := &recorder{}
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_ = b.Register(uint64(0x100*i), 0x10, d)
			buf := make([]byte, 1)
			for j := 0; j < 200; j++ {
				b.Write(uint64(0x100*i+j%0x20), buf)
				b.Read(uint64(j), buf)
			}
		}(i)
	}
	wg.Wait()
	if got := len(d.writes); got != 4*104 { // j%0x20 < 0x10 for 104 of 200 j
		t.Errorf("%d device writes, want %d", got, 4*104)
	}
}

func TestUnclaimedAccessesAreLoggedRateLimited(t *testing.T) {
	var out bytes.Buffer
	b := NewPIOBus(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	buf := make([]byte, 1)
	for range 100 {
		b.Read(0x80, buf)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != ratelog.DefaultBurst {
		t.Fatalf("%d lines for 100 unclaimed reads, want %d:\n%s", len(lines), ratelog.DefaultBurst, out.String())
	}
	if !strings.Contains(lines[0], `bus="port I/O" op=read addr=0x80 size=1`) {
		t.Errorf("line %q", lines[0])
	}
}

// FuzzBusDispatch registers random ranges and checks every access against a
// naive model: it reaches the one device fully containing it, at the right
// offset, or nothing.
func FuzzBusDispatch(f *testing.F) {
	f.Add([]byte{0x10, 4, 0x20, 8, 0x12, 1}, uint16(0x11), uint8(2))
	f.Add([]byte{0xff, 0xff, 0, 1}, uint16(0xfffe), uint8(4))
	f.Fuzz(func(t *testing.T, spec []byte, addr uint16, size uint8) {
		if size == 0 || size > 8 {
			return
		}
		b := NewPIOBus(quietLogger())
		type reg struct {
			base, size uint64
			dev        *recorder
		}
		var regs []reg
		for i := 0; i+1 < len(spec) && len(regs) < 16; i += 2 {
			base, n := uint64(spec[i])<<8, uint64(spec[i+1])
			d := &recorder{}
			err := b.Register(base, n, d)
			overlaps := n == 0
			for _, r := range regs {
				if base < r.base+r.size && r.base < base+n {
					overlaps = true
				}
			}
			if (err == nil) == overlaps {
				t.Fatalf("Register(%#x, %#x): err %v, overlaps %v", base, n, err, overlaps)
			}
			if err == nil {
				regs = append(regs, reg{base, n, d})
			}
		}
		a := uint64(addr)
		b.Write(a, make([]byte, size))
		for _, r := range regs {
			inside := a >= r.base && a+uint64(size) <= r.base+r.size
			if got := len(r.dev.writes); got != map[bool]int{true: 1, false: 0}[inside] {
				t.Fatalf("device [%#x,+%#x) got %d writes for [%#x,+%d)", r.base, r.size, got, a, size)
			}
			if inside && r.dev.writes[0].offset != a-r.base {
				t.Fatalf("offset %#x, want %#x", r.dev.writes[0].offset, a-r.base)
			}
		}
	})
}
