package virtio_test

import (
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// FuzzQueue input: byte 0 picks the queue size (1 << (b % 6)), byte 1 the
// ring features (bit 0 indirect, bit 1 event index), the rest is guest
// memory from address 0: descriptor table at fuzzDesc, available ring at
// fuzzAvail, used ring at fuzzUsed, buffers anywhere.
const (
	fuzzMemSize = 16 << 10
	fuzzDesc    = 0x000
	fuzzAvail   = 0x200
	fuzzUsed    = 0x300
)

type seedDesc struct {
	addr        uint64
	length      uint32
	flags, next uint16
}

func putDescs(mem []byte, at int, descs ...seedDesc) {
	for i, d := range descs {
		b := mem[at+16*i:]
		binary.LittleEndian.PutUint64(b[0:], d.addr)
		binary.LittleEndian.PutUint32(b[8:], d.length)
		binary.LittleEndian.PutUint16(b[12:], d.flags)
		binary.LittleEndian.PutUint16(b[14:], d.next)
	}
}

func putAvail(mem []byte, idx uint16, heads ...uint16) {
	binary.LittleEndian.PutUint16(mem[fuzzAvail+2:], idx)
	for i, h := range heads {
		binary.LittleEndian.PutUint16(mem[fuzzAvail+4+2*i:], h)
	}
}

// queueSeeds are well-formed and classic hostile rings.
func queueSeeds() [][]byte {
	mk := func(sizeExp, features byte, fill func(mem []byte)) []byte {
		mem := make([]byte, 0x1000)
		fill(mem)
		return append([]byte{sizeExp, features}, mem...)
	}
	N, W, I := virtio.DescFlagNext, virtio.DescFlagWrite, virtio.DescFlagIndirect
	return [][]byte{
		// A direct chain (readable, writable) and an indirect one.
		mk(2, 3, func(mem []byte) {
			putDescs(mem, fuzzDesc,
				seedDesc{0x500, 16, N, 1}, seedDesc{0x600, 32, W, 0}, seedDesc{0x700, 32, I, 0})
			putDescs(mem, 0x700, seedDesc{0x800, 8, N, 1}, seedDesc{0x900, 8, W, 0})
			putAvail(mem, 2, 0, 2)
		}),
		// A loop.
		mk(3, 0, func(mem []byte) {
			putDescs(mem, fuzzDesc, seedDesc{0x500, 16, N, 1}, seedDesc{0x600, 16, N, 0})
			putAvail(mem, 1, 0)
		}),
		// The available index far ahead.
		mk(1, 0, func(mem []byte) { putAvail(mem, 40, 0, 1) }),
		// Writable then readable, and a buffer outside memory.
		mk(2, 1, func(mem []byte) {
			putDescs(mem, fuzzDesc, seedDesc{0x500, 16, W | N, 1}, seedDesc{0x600, 16, 0, 0}, seedDesc{1 << 40, 16, 0, 0})
			putAvail(mem, 2, 0, 2)
		}),
	}
}

func FuzzQueue(f *testing.F) {
	for _, s := range queueSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		size := uint16(1) << (data[0] % 6)
		var features uint64
		if data[1]&1 != 0 {
			features |= virtio.FeatureIndirectDesc
		}
		if data[1]&2 != 0 {
			features |= virtio.FeatureEventIdx
		}
		mem := virtio.NewSliceMemory(fuzzMemSize)
		image := data[2:]
		if len(image) > fuzzMemSize {
			image = image[:fuzzMemSize]
		}
		if err := mem.WriteAt(image, 0); err != nil {
			t.Fatal(err)
		}
		q, err := virtio.NewQueue(mem, virtio.QueueLayout{Size: size, DescTable: fuzzDesc, AvailRing: fuzzAvail, UsedRing: fuzzUsed}, features)
		if err != nil {
			t.Fatal(err)
		}
		// Where the device may write: the used ring (with avail_event)
		// and the writable buffers of the chains it was given.
		allowed := []virtio.Buffer{{Addr: fuzzUsed, Len: 6 + 8*uint32(size)}}
		completions := 0
		for range 2*int(size) + 2 {
			c, err := q.Pop()
			var chainErr *virtio.ChainError
			if errors.As(err, &chainErr) {
				completions++
				continue
			}
			if err != nil {
				if !errors.Is(err, virtio.ErrQueueBroken) {
					t.Fatalf("Pop: unexpected error kind %v", err)
				}
				if _, again := q.Pop(); !errors.Is(again, virtio.ErrQueueBroken) {
					t.Fatal("broken queue recovered by itself")
				}
				break
			}
			if c == nil {
				break
			}
			checkChain(t, c)
			allowed = append(allowed, c.Writable()...)
			if err := q.Push(c, c.Writer().Written()); err != nil {
				if errors.Is(err, virtio.ErrQueueBroken) {
					break
				}
				t.Fatal(err)
			}
			completions++
			q.NeedsInterrupt()
		}
		after := make([]byte, fuzzMemSize)
		if err := mem.ReadAt(after, 0); err != nil {
			t.Fatal(err)
		}
		before := make([]byte, fuzzMemSize)
		copy(before, image)
		for _, b := range allowed {
			copy(before[b.Addr:b.Addr+uint64(b.Len)], after[b.Addr:])
		}
		if i := firstDifference(before, after); i >= 0 {
			t.Fatalf("device wrote at %#x, outside the used ring and the writable buffers", i)
		}
		if completions > 0 {
			idx, err := mem.Uint16(fuzzUsed + 2)
			if err != nil {
				t.Fatal(err)
			}
			if idx != uint16(completions) {
				t.Fatalf("used index %d after %d completions", idx, completions)
			}
		}
	})
}

func firstDifference(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// checkChain asserts the invariants a device relies on.
func checkChain(t *testing.T, c *virtio.Chain) {
	t.Helper()
	var read, write uint64
	for _, b := range c.Readable() {
		if b.Len == 0 || b.Addr+uint64(b.Len) > fuzzMemSize || b.Addr+uint64(b.Len) < b.Addr {
			t.Fatalf("readable buffer %+v outside memory", b)
		}
		read += uint64(b.Len)
	}
	for _, b := range c.Writable() {
		if b.Len == 0 || b.Addr+uint64(b.Len) > fuzzMemSize || b.Addr+uint64(b.Len) < b.Addr {
			t.Fatalf("writable buffer %+v outside memory", b)
		}
		write += uint64(b.Len)
	}
	if read != uint64(c.ReadableLen()) || write != uint64(c.WritableLen()) || read+write > virtio.MaxChainBytes {
		t.Fatalf("lengths %d/%d do not match buffers %d/%d", c.ReadableLen(), c.WritableLen(), read, write)
	}
	got, err := io.Copy(io.Discard, c.Reader())
	if err != nil || uint64(got) != read {
		t.Fatalf("reader gave %d bytes (%v), want %d", got, err, read)
	}
	n, err := c.Writer().Write(make([]byte, write+1))
	if uint64(n) != write || !errors.Is(err, virtio.ErrChainFull) {
		t.Fatalf("writer took %d bytes (%v), want %d and ErrChainFull", n, err, write)
	}
}

// drainDevice pops and completes every chain on Notify, synchronously, so
// FuzzMMIO drives the queue code through the registers.
type drainDevice struct {
	probeDevice
}

func (d *drainDevice) Notify(queue int) {
	q, irq := d.queues[queue], d.irq
	for range 64 {
		c, err := q.Pop()
		var chainErr *virtio.ChainError
		if errors.As(err, &chainErr) {
			continue
		}
		if err != nil {
			irq.NeedsReset(err)
			return
		}
		if c == nil {
			break
		}
		_, _ = io.Copy(c.Writer(), io.LimitReader(c.Reader(), 64))
		if err := q.Complete(c, c.Writer().Written(), irq); err != nil {
			irq.NeedsReset(err)
			return
		}
	}
}

// FuzzMMIO input: a sequence of 7-byte operations: kind, 16-bit offset,
// 32-bit value. Kinds: 0 register read, 1 register write, 2 guest memory
// write (offset is the address), 3 one-byte config access.
func FuzzMMIO(f *testing.F) {
	op := func(kind byte, offset uint16, value uint32) []byte {
		b := []byte{kind, 0, 0, 0, 0, 0, 0}
		binary.LittleEndian.PutUint16(b[1:], offset)
		binary.LittleEndian.PutUint32(b[3:], value)
		return b
	}
	var linux []byte // what Linux's probe does, with a queue of 4 at 0x1000
	for _, o := range [][]byte{
		op(0, virtio.MMIOMagicValue, 0), op(1, virtio.MMIOStatus, 0), op(1, virtio.MMIOStatus, 1), op(1, virtio.MMIOStatus, 3),
		op(1, virtio.MMIODriverFeaturesSel, 1), op(1, virtio.MMIODriverFeatures, 1), op(1, virtio.MMIOStatus, 11),
		op(1, virtio.MMIOQueueSel, 0), op(1, virtio.MMIOQueueNum, 4), op(1, virtio.MMIOQueueDescLow, 0x1000),
		op(1, virtio.MMIOQueueDriverLow, 0x1100), op(1, virtio.MMIOQueueDeviceLow, 0x1200), op(1, virtio.MMIOQueueReady, 1),
		op(1, virtio.MMIOStatus, 15), op(2, 0x1000, 0x2000), op(2, 0x1008, 0x00010010), op(2, 0x1102, 1),
		op(1, virtio.MMIOQueueNotify, 0), op(0, virtio.MMIOInterruptStatus, 0), op(1, virtio.MMIOInterruptACK, 1),
	} {
		linux = append(linux, o...)
	}
	f.Add(linux)
	f.Add(append(op(1, virtio.MMIOQueueNotify, 0), op(1, virtio.MMIOQueueNum, 3)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		dev := &drainDevice{probeDevice: *newProbeDevice(8)}
		mem := virtio.NewSliceMemory(fuzzMemSize)
		m := virtio.NewMMIO(dev, mem, nil, virtio.MMIOOptions{Logger: discardLogger()})
		for len(data) >= 7 {
			kind, offset, value := data[0]%4, uint64(binary.LittleEndian.Uint16(data[1:])), binary.LittleEndian.Uint32(data[3:])
			data = data[7:]
			var b [4]byte
			binary.LittleEndian.PutUint32(b[:], value)
			switch kind {
			case 0:
				m.Read(offset, b[:])
				if offset == virtio.MMIOMagicValue && binary.LittleEndian.Uint32(b[:]) != virtio.MMIOMagic {
					t.Fatal("magic changed")
				}
			case 1:
				m.Write(offset, b[:])
			case 2:
				_ = mem.WriteAt(b[:], offset)
			case 3:
				m.Read(virtio.MMIOConfig+offset%0x100, b[:1])
				m.Write(virtio.MMIOConfig+offset%0x100, b[1:2])
			}
			if m.InterruptStatus()&^3 != 0 {
				t.Fatalf("interrupt status %#x has unknown bits", m.InterruptStatus())
			}
			if s := m.Status(); s&virtio.StatusDriverOK != 0 && s&virtio.StatusFeaturesOK == 0 {
				t.Fatalf("status %#x: DRIVER_OK without FEATURES_OK", s)
			}
		}
		m.Reset()
	})
}
