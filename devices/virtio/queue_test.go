package virtio_test

import (
	"bytes"
	"errors"
	"io"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

const waitTimeout = 5 * time.Second

func TestChainReaderWriterAcrossBuffers(t *testing.T) {
	for _, indirect := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "indirect"}[indirect], func(t *testing.T) {
			dev, d := setup(t, virtiotest.Options{})
			dq := d.Queue(0)
			// A 6-byte header split over two descriptors, sharing the
			// second with the start of the payload.
			bufs := []virtiotest.Buffer{
				virtiotest.Readable([]byte("HEA")),
				virtiotest.Readable([]byte("DERpay")),
				virtiotest.Readable([]byte("load")),
				virtiotest.Writable(3),
				virtiotest.Writable(10),
			}
			add := dq.Add
			if indirect {
				add = dq.AddIndirect
			}
			head, err := add(bufs...)
			require.NoError(t, err)

			q := dev.queue(t, 0)
			c, err := q.Pop()
			require.NoError(t, err)
			require.NotNil(t, c)
			require.Equal(t, head, c.Head())
			require.EqualValues(t, 13, c.ReadableLen())
			require.EqualValues(t, 13, c.WritableLen())
			require.Len(t, c.Readable(), 3)
			require.Len(t, c.Writable(), 2)

			r := c.Reader()
			header := make([]byte, 6)
			_, err = io.ReadFull(r, header)
			require.NoError(t, err)
			require.Equal(t, "HEADER", string(header))
			require.EqualValues(t, 7, r.Remaining())
			require.EqualValues(t, 1, r.Skip(1))
			rest, err := io.ReadAll(r)
			require.NoError(t, err)
			require.Equal(t, "ayload", string(rest))
			n, err := r.Read(make([]byte, 1))
			require.Zero(t, n)
			require.ErrorIs(t, err, io.EOF)

			w := c.Writer()
			_, err = w.Write([]byte("reply"))
			require.NoError(t, err)
			require.EqualValues(t, 5, w.Written())
			require.EqualValues(t, 8, w.Available())
			n, err = w.Write([]byte("0123456789"))
			require.ErrorIs(t, err, virtio.ErrChainFull)
			require.ErrorIs(t, err, io.ErrShortWrite)
			require.Equal(t, 8, n)

			require.NoError(t, q.Push(c, w.Written()))
			require.ErrorIs(t, q.Push(c, 1), virtio.ErrAlreadyPushed)
			used, ok, err := dq.Poll()
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, head, used.Head)
			require.EqualValues(t, 13, used.Len)
			require.Equal(t, "reply01234567", string(used.Data))
			require.Equal(t, 16, dq.FreeDescriptors(), "descriptors recycled")
		})
	}
}

func TestPopEmptyAndPushClampsLength(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{})
	q := dev.queue(t, 0)
	c, err := q.Pop()
	require.NoError(t, err)
	require.Nil(t, c)

	_, err = d.Queue(0).Add(virtiotest.Writable(4))
	require.NoError(t, err)
	c, err = q.Pop()
	require.NoError(t, err)
	require.NoError(t, q.Push(c, 1000)) // a device bug must not lie to the guest
	used, ok, err := d.Queue(0).Poll()
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 4, used.Len)
}

func TestPushToWrongQueue(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{}, 8, 8)
	_, err := d.Queue(0).Add(virtiotest.Writable(4))
	require.NoError(t, err)
	c, err := dev.queue(t, 0).Pop()
	require.NoError(t, err)
	require.Error(t, dev.queue(t, 1).Push(c, 0))
}

// hostileCase writes raw descriptors and publishes a head; the queue must
// refuse the chain, complete it with length 0, and then serve a good one.
type hostileCase struct {
	name     string
	maxSize  uint16
	refuse   uint64 // features the driver declines
	build    func(t *testing.T, d *virtiotest.Driver, dq *virtiotest.DriverQueue) uint16
	contains string
}

func desc(addr uint64, length uint32, flags, next uint16) virtiotest.Descriptor {
	return virtiotest.Descriptor{Addr: addr, Len: length, Flags: flags, Next: next}
}

func hostileCases() []hostileCase {
	const buf = 0x10000 // inside the 16 MiB test memory
	write := func(descs ...virtiotest.Descriptor) func(*testing.T, *virtiotest.Driver, *virtiotest.DriverQueue) uint16 {
		return func(t *testing.T, d *virtiotest.Driver, dq *virtiotest.DriverQueue) uint16 {
			for i, dsc := range descs {
				require.NoError(t, dq.WriteDescriptor(uint16(i), dsc))
			}
			return 0
		}
	}
	indirect := func(table ...virtiotest.Descriptor) func(*testing.T, *virtiotest.Driver, *virtiotest.DriverQueue) uint16 {
		return func(t *testing.T, d *virtiotest.Driver, dq *virtiotest.DriverQueue) uint16 {
			addr, err := d.Alloc(uint64(16*len(table)), 16)
			require.NoError(t, err)
			require.NoError(t, dq.WriteTable(addr, table))
			require.NoError(t, dq.WriteDescriptor(0, desc(addr, uint32(16*len(table)), virtio.DescFlagIndirect, 0)))
			return 0
		}
	}
	N, W, I := virtio.DescFlagNext, virtio.DescFlagWrite, virtio.DescFlagIndirect
	return []hostileCase{
		{name: "self loop", build: write(desc(buf, 8, N, 0)), contains: "loop"},
		{name: "two-descriptor loop", build: write(desc(buf, 8, N, 1), desc(buf, 8, N, 0)), contains: "loop"},
		{name: "next out of range", build: write(desc(buf, 8, N, 16)), contains: "out of range"},
		{name: "head out of range", build: func(*testing.T, *virtiotest.Driver, *virtiotest.DriverQueue) uint16 { return 999 }, contains: "head index"},
		{name: "address beyond memory", build: write(desc(1<<40, 8, 0, 0)), contains: "not in guest memory"},
		{name: "buffer crossing the end", build: write(desc(16<<20-4, 8, 0, 0)), contains: "not in guest memory"},
		{name: "address wraps", build: write(desc(math.MaxUint64-3, 8, 0, 0)), contains: "wraps"},
		{name: "readable after writable", build: write(desc(buf, 8, N|W, 1), desc(buf, 8, 0, 0)), contains: "readable descriptor after a writable"},
		{name: "too many bytes", maxSize: 128, build: func(t *testing.T, d *virtiotest.Driver, dq *virtiotest.DriverQueue) uint16 {
			for i := range uint16(70) {
				require.NoError(t, dq.WriteDescriptor(i, desc(buf, 1<<20, N, i+1)))
			}
			require.NoError(t, dq.WriteDescriptor(70, desc(buf, 1, 0, 0)))
			return 0
		}, contains: "total more than"},
		{name: "indirect not negotiated", refuse: virtio.FeatureIndirectDesc, build: indirect(desc(buf, 8, 0, 0)), contains: "without VIRTIO_F_INDIRECT_DESC"},
		{name: "indirect with next", build: write(desc(buf, 32, I|N, 1)), contains: "NEXT"},
		{name: "indirect zero length", build: write(desc(buf, 0, I, 0)), contains: "multiple of 16"},
		{name: "indirect odd length", build: write(desc(buf, 24, I, 0)), contains: "multiple of 16"},
		{name: "indirect huge table", build: write(desc(buf, 16*(virtio.MaxQueueSize+1), I, 0)), contains: "exceeds"},
		{name: "indirect table outside memory", build: write(desc(1<<40, 32, I, 0)), contains: "indirect table"},
		{name: "nested indirect", build: indirect(desc(buf, 16, I, 0)), contains: "nested"},
		{name: "indirect loop", build: indirect(desc(buf, 8, N, 1), desc(buf, 8, N, 0)), contains: "loop"},
		{name: "indirect next out of range", build: indirect(desc(buf, 8, N, 2), desc(buf, 8, 0, 0)), contains: "out of range"},
		{name: "indirect bad buffer", build: indirect(desc(1<<40, 8, 0, 0)), contains: "not in guest memory"},
		{name: "indirect readable after writable", build: indirect(desc(buf, 8, N|W, 1), desc(buf, 8, 0, 0)), contains: "readable descriptor after"},
	}
}

func TestHostileChainsAreRefusedAndQueueKeepsWorking(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			maxSize := tc.maxSize
			if maxSize == 0 {
				maxSize = 16
			}
			dev, d := setup(t, virtiotest.Options{RefuseFeatures: tc.refuse}, maxSize)
			dq := d.Queue(0)
			q := dev.queue(t, 0)
			head := tc.build(t, d, dq)
			require.NoError(t, dq.PublishHead(head))

			chainErr := popChainError(t, q)
			require.Equal(t, head, chainErr.Head)
			require.Contains(t, chainErr.Error(), tc.contains)

			// Completed with used length 0.
			used, ok, err := dq.Poll()
			require.True(t, ok)
			if head < maxSize {
				require.NoError(t, err)
			}
			require.Equal(t, head, used.Head)
			require.Zero(t, used.Len)

			// A good chain after the bad one still works. Use descriptor
			// indices away from the raw ones.
			require.NoError(t, dq.WriteDescriptor(maxSize-1, desc(0x20000, 4, virtio.DescFlagWrite, 0)))
			require.NoError(t, dq.PublishHead(maxSize-1))
			c, err := q.Pop()
			require.NoError(t, err)
			require.NotNil(t, c)
			_, err = c.Writer().Write([]byte("ok!!"))
			require.NoError(t, err)
			require.NoError(t, q.Push(c, c.Writer().Written()))
			used, ok, err = dq.Poll()
			require.NoError(t, err)
			require.True(t, ok)
			require.EqualValues(t, 4, used.Len)
			require.Zero(t, d.Status()&virtio.StatusDeviceNeedsReset, "a bad chain is not a broken queue")
		})
	}
}

func TestZeroLengthDescriptorsAreSkipped(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{})
	dq := d.Queue(0)
	_, err := dq.Add(virtiotest.Readable(nil), virtiotest.Readable([]byte("x")), virtiotest.Writable(0), virtiotest.Writable(2))
	require.NoError(t, err)
	c, err := dev.queue(t, 0).Pop()
	require.NoError(t, err)
	require.Len(t, c.Readable(), 1)
	require.Len(t, c.Writable(), 1)
	require.EqualValues(t, 1, c.ReadableLen())
	require.EqualValues(t, 2, c.WritableLen())
}

func TestAvailIndexRunningAheadBreaksQueue(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{}, 8)
	dq := d.Queue(0)
	q := dev.queue(t, 0)
	require.NoError(t, dq.SetAvailIdx(9))
	c, err := q.Pop()
	require.Nil(t, c)
	require.ErrorIs(t, err, virtio.ErrQueueBroken)
	// Sticky: even once the index looks sane again.
	require.NoError(t, dq.SetAvailIdx(0))
	_, err = q.Pop()
	require.ErrorIs(t, err, virtio.ErrQueueBroken)

	// The device reports it; the transport sets DEVICE_NEEDS_RESET and
	// raises a config interrupt.
	before := d.IRQ.Count()
	dev.interrupt().NeedsReset(err)
	require.NotZero(t, d.Status()&virtio.StatusDeviceNeedsReset)
	require.NotZero(t, d.MMIO().InterruptStatus()&virtio.InterruptConfigChange)
	require.Greater(t, d.IRQ.Count(), before)
}

func TestExactlyQueueSizePendingIsFine(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{}, 4)
	dq := d.Queue(0)
	for range 4 {
		_, err := dq.Add(virtiotest.Writable(1))
		require.NoError(t, err)
	}
	q := dev.queue(t, 0)
	for range 4 {
		c, err := q.Pop()
		require.NoError(t, err)
		require.NotNil(t, c)
		require.NoError(t, q.Push(c, 0))
	}
	used, err := dq.WaitN(4, waitTimeout)
	require.NoError(t, err)
	require.Len(t, used, 4)
}

func TestIndexWrapAround(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{}, 4)
	dq := d.Queue(0)
	q := dev.queue(t, 0)
	// 70000 chains: the 16-bit indices wrap.
	for i := range 70000 {
		_, err := dq.Add(virtiotest.Readable([]byte{byte(i)}), virtiotest.Writable(1))
		require.NoError(t, err)
		c, err := q.Pop()
		require.NoError(t, err)
		b := make([]byte, 1)
		_, err = io.ReadFull(c.Reader(), b)
		require.NoError(t, err)
		require.Equal(t, byte(i), b[0])
		require.NoError(t, q.Push(c, 0))
		_, ok, err := dq.Poll()
		require.NoError(t, err)
		require.True(t, ok)
	}
}

func TestNeedsInterruptWithoutEventIdx(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{RefuseFeatures: virtio.FeatureEventIdx})
	dq := d.Queue(0)
	q := dev.queue(t, 0)
	require.False(t, q.NeedsInterrupt(), "nothing pushed")
	complete := func() {
		_, err := dq.Add(virtiotest.Writable(1))
		require.NoError(t, err)
		c, err := q.Pop()
		require.NoError(t, err)
		require.NoError(t, q.Push(c, 0))
	}
	complete()
	require.True(t, q.NeedsInterrupt())
	require.False(t, q.NeedsInterrupt(), "already decided for this push")
	require.NoError(t, dq.SetAvailFlags(virtio.AvailFlagNoInterrupt))
	complete()
	require.False(t, q.NeedsInterrupt(), "driver asked for no interrupts")
}

func TestNeedsInterruptWithEventIdx(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{})
	require.NotZero(t, d.Features()&virtio.FeatureEventIdx)
	dq := d.Queue(0)
	q := dev.queue(t, 0)
	usedEvent := dq.Layout().AvailRing + 4 + 2*uint64(dq.Layout().Size)
	complete := func() {
		_, err := dq.Add(virtiotest.Writable(1))
		require.NoError(t, err)
		c, err := q.Pop()
		require.NoError(t, err)
		require.NoError(t, q.Push(c, 0))
	}
	// used_event 0: interrupt when the used index passes 0 (first push).
	complete()
	require.True(t, q.NeedsInterrupt())
	// used_event 3: no interrupt for the 2nd and 3rd, one for the 4th.
	require.NoError(t, d.Mem.PutUint16(usedEvent, 3))
	complete()
	require.False(t, q.NeedsInterrupt())
	complete()
	require.False(t, q.NeedsInterrupt())
	complete()
	require.True(t, q.NeedsInterrupt())
}

func TestEventIdxPublishesAvailEvent(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{})
	dq := d.Queue(0)
	q := dev.queue(t, 0)
	availEvent := dq.Layout().UsedRing + 4 + 8*uint64(dq.Layout().Size)
	for range 3 {
		_, err := dq.Add(virtiotest.Writable(1))
		require.NoError(t, err)
		c, err := q.Pop()
		require.NoError(t, err)
		require.NoError(t, q.Push(c, 0))
	}
	c, err := q.Pop()
	require.NoError(t, err)
	require.Nil(t, c)
	v, err := d.Mem.Uint16(availEvent)
	require.NoError(t, err)
	require.EqualValues(t, 3, v, "device asks to be notified at the next entry")
}

func TestQueueLayoutValidation(t *testing.T) {
	mem := virtio.NewSliceMemory(1 << 20)
	good := virtio.QueueLayout{Size: 8, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3000}
	_, err := virtio.NewQueue(mem, good, 0)
	require.NoError(t, err)
	for name, l := range map[string]virtio.QueueLayout{
		"size zero":             {Size: 0, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3000},
		"size not power of two": {Size: 6, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3000},
		"size too big":          {Size: 65535, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3000},
		"desc misaligned":       {Size: 8, DescTable: 0x1008, AvailRing: 0x2000, UsedRing: 0x3000},
		"avail misaligned":      {Size: 8, DescTable: 0x1000, AvailRing: 0x2001, UsedRing: 0x3000},
		"used misaligned":       {Size: 8, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3002},
		"desc outside memory":   {Size: 8, DescTable: 1 << 20, AvailRing: 0x2000, UsedRing: 0x3000},
		"used crossing the end": {Size: 8, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 1<<20 - 16},
		"avail wraps":           {Size: 8, DescTable: 0x1000, AvailRing: math.MaxUint64 - 1, UsedRing: 0x3000},
	} {
		_, err := virtio.NewQueue(mem, l, 0)
		require.ErrorIs(t, err, virtio.ErrInvalidLayout, name)
	}
	require.ErrorIs(t, good.Validate(4), virtio.ErrInvalidLayout, "size above the device's maximum")
}

// probingMemory is a GuestMemory without RangeChecker: the queue must
// probe buffer ends instead.
type probingMemory struct{ m *virtio.SliceMemory }

func (p probingMemory) ReadAt(b []byte, gpa uint64) error  { return p.m.ReadAt(b, gpa) }
func (p probingMemory) WriteAt(b []byte, gpa uint64) error { return p.m.WriteAt(b, gpa) }

func TestQueueWithoutRangeChecker(t *testing.T) {
	slice := virtio.NewSliceMemory(1 << 20)
	mem := probingMemory{slice}
	l := virtio.QueueLayout{Size: 4, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3000}
	q, err := virtio.NewQueue(mem, l, 0)
	require.NoError(t, err)
	put := func(i uint16, addr uint64, length uint32) {
		var b [16]byte
		le := func(off int, v uint64, n int) {
			for k := range n {
				b[off+k] = byte(v >> (8 * k))
			}
		}
		le(0, addr, 8)
		le(8, uint64(length), 4)
		require.NoError(t, slice.WriteAt(b[:], l.DescTable+16*uint64(i)))
	}
	put(0, 1<<20-8, 16) // crosses the end
	put(1, 0x8000, 16)
	require.NoError(t, slice.PutUint16(l.AvailRing+4, 0))
	require.NoError(t, slice.PutUint16(l.AvailRing+6, 1))
	require.NoError(t, slice.PutUint16(l.AvailRing+2, 2))
	_, err = q.Pop()
	var chainErr *virtio.ChainError
	require.True(t, errors.As(err, &chainErr))
	c, err := q.Pop()
	require.NoError(t, err)
	require.EqualValues(t, 16, c.ReadableLen())
	_, err = virtio.NewQueue(mem, virtio.QueueLayout{Size: 4, DescTable: 1 << 20, AvailRing: 0x2000, UsedRing: 0x3000}, 0)
	require.ErrorIs(t, err, virtio.ErrInvalidLayout)
}

// failingMemory starts failing after a number of accesses.
type failingMemory struct {
	*virtio.SliceMemory
	fail bool
}

func (f *failingMemory) ReadAt(b []byte, gpa uint64) error {
	if f.fail {
		return errors.New("memory gone")
	}
	return f.SliceMemory.ReadAt(b, gpa)
}

func TestMemoryErrorsBreakQueueNotProcess(t *testing.T) {
	mem := &failingMemory{SliceMemory: virtio.NewSliceMemory(1 << 20)}
	l := virtio.QueueLayout{Size: 4, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3000}
	q, err := virtio.NewQueue(mem, l, 0)
	require.NoError(t, err)
	mem.fail = true
	_, err = q.Pop()
	require.ErrorIs(t, err, virtio.ErrQueueBroken)
}

func TestChainReaderReportsMemoryError(t *testing.T) {
	mem := &failingMemory{SliceMemory: virtio.NewSliceMemory(1 << 20)}
	l := virtio.QueueLayout{Size: 4, DescTable: 0x1000, AvailRing: 0x2000, UsedRing: 0x3000}
	q, err := virtio.NewQueue(mem, l, 0)
	require.NoError(t, err)
	var b [16]byte
	b[1] = 0x80 // addr 0x8000
	b[8] = 4    // len 4
	require.NoError(t, mem.WriteAt(b[:], l.DescTable))
	require.NoError(t, mem.PutUint16(l.AvailRing+2, 1))
	c, err := q.Pop()
	require.NoError(t, err)
	mem.fail = true
	_, err = c.Reader().Read(make([]byte, 4))
	require.Error(t, err)
	require.False(t, errors.Is(err, io.EOF))
}

func TestSliceMemoryBounds(t *testing.T) {
	m := virtio.NewSliceMemory(16)
	require.NoError(t, m.WriteAt([]byte("abcd"), 12))
	require.ErrorIs(t, m.WriteAt([]byte("abcd"), 13), virtio.ErrOutOfRange)
	require.ErrorIs(t, m.ReadAt(make([]byte, 1), 16), virtio.ErrOutOfRange)
	require.ErrorIs(t, m.ReadAt(make([]byte, 2), math.MaxUint64), virtio.ErrOutOfRange)
	require.NoError(t, m.ReadAt(nil, 16))
	got := make([]byte, 4)
	require.NoError(t, m.ReadAt(got, 12))
	require.True(t, bytes.Equal(got, []byte("abcd")))
}

func TestSetMaxChainBytesRaisesAndLowersTheCap(t *testing.T) {
	const buf = 0x10000
	dev, d := setup(t, virtiotest.Options{MemSize: 8 << 20}, 128)
	dq := d.Queue(0)
	q := dev.queue(t, 0)
	// 70 descriptors of 1 MiB each: 70 MiB, over the default 64 MiB.
	publishBig := func() {
		for i := range uint16(70) {
			flags := virtio.DescFlagNext
			if i == 69 {
				flags = 0
			}
			require.NoError(t, dq.WriteDescriptor(i, desc(buf, 1<<20, flags, i+1)))
		}
		require.NoError(t, dq.PublishHead(0))
	}
	publishBig()
	require.Contains(t, popChainError(t, q).Error(), "total more than 67108864")

	q.SetMaxChainBytes(128 << 20)
	publishBig()
	c, err := q.Pop()
	require.NoError(t, err)
	require.EqualValues(t, 70<<20, c.ReadableLen())
	require.NoError(t, q.Push(c, 0))

	q.SetMaxChainBytes(1 << 20)
	publishBig()
	require.Contains(t, popChainError(t, q).Error(), "total more than 1048576")

	q.SetMaxChainBytes(1 << 40) // clamped: chain lengths are 32-bit
	q.SetMaxChainBytes(0)       // back to the default
	publishBig()
	require.Contains(t, popChainError(t, q).Error(), "total more than 67108864")
}
