package vmm

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

func TestLayoutSplitsAroundTheHole(t *testing.T) {
	if got := Layout(512<<20, DefaultMMIOHoleStart); len(got) != 1 || got[0] != (MemoryRegion{0, 512 << 20}) {
		t.Errorf("512 MiB: %+v", got)
	}
	got := Layout(4<<30, DefaultMMIOHoleStart)
	want := []MemoryRegion{{0, DefaultMMIOHoleStart}, {MMIOHoleEnd, 4<<30 - DefaultMMIOHoleStart}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("4 GiB: %+v, want %+v", got, want)
	}
}

func TestNewMemoryRejectsBadRegions(t *testing.T) {
	for name, regions := range map[string][]MemoryRegion{
		"none":      nil,
		"empty":     {{0, 0}},
		"unaligned": {{0x800, 0x1000}},
		"odd size":  {{0, 0x1800}},
		"overlap":   {{0, 0x2000}, {0x1000, 0x1000}},
		"wraps":     {{math.MaxUint64 - 0xfff, 0x2000}},
	} {
		if m, err := NewMemory(regions); err == nil {
			m.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestMemoryAccessIsBoundsChecked(t *testing.T) {
	m, err := NewMemory([]MemoryRegion{{0x10000, 0x2000}, {0, 0x1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Size() != 0x3000 || m.Regions()[0].GPA != 0 {
		t.Fatalf("size %#x regions %+v", m.Size(), m.Regions())
	}
	if err := m.WriteAt([]byte("hello"), 0x11ffb); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if err := m.ReadAt(got, 0x11ffb); err != nil || string(got) != "hello" {
		t.Fatalf("read back %q, %v", got, err)
	}
	s, err := m.Slice(0x11ffb, 5)
	if err != nil || !bytes.Equal(s, got) || cap(s) != 5 {
		t.Fatalf("Slice %q cap %d, %v", s, cap(s), err)
	}
	for _, c := range []struct {
		gpa, n uint64
	}{
		{0x11ffc, 5},        // runs past the end of a region
		{0x0ffe, 4},         // runs from RAM into the gap
		{0x1000, 1},         // in the gap
		{0x12000, 1},        // just past the last region
		{math.MaxUint64, 2}, // would wrap
		{0, math.MaxUint64}, // absurd length
		{0x10000, 0x2001},   // one byte too long
	} {
		buf := make([]byte, min(c.n, 16))
		if err := m.CheckRange(c.gpa, c.n); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("CheckRange(%#x, %#x) = %v", c.gpa, c.n, err)
		}
		if c.n <= 16 {
			if err := m.ReadAt(buf, c.gpa); !errors.Is(err, ErrOutOfRange) {
				t.Errorf("ReadAt(%#x, %d) = %v", c.gpa, c.n, err)
			}
			if err := m.WriteAt(buf, c.gpa); !errors.Is(err, ErrOutOfRange) {
				t.Errorf("WriteAt(%#x, %d) = %v", c.gpa, c.n, err)
			}
		}
		if _, err := m.Slice(c.gpa, c.n); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Slice(%#x, %#x) = %v", c.gpa, c.n, err)
		}
	}
	if err := m.CheckRange(0x10000, 0x2000); err != nil {
		t.Errorf("whole region: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.ReadAt(got, 0x10000); !errors.Is(err, ErrMemoryClosed) {
		t.Errorf("read after close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func FuzzMemoryAccess(f *testing.F) {
	f.Add(uint64(0), uint16(8))
	f.Add(uint64(0xfff), uint16(2))
	f.Add(uint64(math.MaxUint64), uint16(1))
	m, err := NewMemory([]MemoryRegion{{0, 0x1000}, {0x3000, 0x1000}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { m.Close() })
	f.Fuzz(func(t *testing.T, gpa uint64, n uint16) {
		buf := make([]byte, n)
		inside := (gpa+uint64(n) >= gpa) && ((gpa+uint64(n) <= 0x1000) || (gpa >= 0x3000 && gpa+uint64(n) <= 0x4000))
		if n == 0 {
			inside = gpa < 0x1000 || (gpa >= 0x3000 && gpa < 0x4000)
		}
		err := m.ReadAt(buf, gpa)
		if (err == nil) != inside {
			t.Fatalf("ReadAt(%#x, %d): err %v, inside %v", gpa, n, err, inside)
		}
		if err := m.WriteAt(buf, gpa); (err == nil) != inside {
			t.Fatalf("WriteAt(%#x, %d): err %v, inside %v", gpa, n, err, inside)
		}
	})
}
