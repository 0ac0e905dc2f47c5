package virtiotest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// Transport is the register window the driver drives: a *virtio.MMIO, or
// anything with the same bus-device methods.
type Transport interface {
	Read(offset uint64, data []byte)
	Write(offset uint64, data []byte)
}

// IRQ is an interrupt line for tests: it counts triggers and wakes one
// waiter. Safe for concurrent use.
type IRQ struct {
	count atomic.Uint64
	wake  chan struct{}
}

// NewIRQ returns an untriggered line.
func NewIRQ() *IRQ { return &IRQ{wake: make(chan struct{}, 1)} }

// Trigger implements devices.IRQ.
func (i *IRQ) Trigger() error {
	i.count.Add(1)
	select {
	case i.wake <- struct{}{}:
	default:
	}
	return nil
}

// Count is the number of triggers so far.
func (i *IRQ) Count() uint64 { return i.count.Load() }

// C receives (coalesced) after triggers.
func (i *IRQ) C() <-chan struct{} { return i.wake }

// Options configure New and Start. The zero value is usable.
type Options struct {
	// MemSize is the guest memory size in bytes; 0 means 16 MiB.
	MemSize int
	// RefuseFeatures are offered feature bits the driver declines
	// (VIRTIO_F_VERSION_1 is always accepted).
	RefuseFeatures uint64
	// QueueSizes gives the size to set up per queue; a missing or 0 entry
	// means the queue's maximum.
	QueueSizes []uint16
	// SkipQueues lists queue indices the driver leaves disabled.
	SkipQueues []int
	// MMIO tunes the transport New creates.
	MMIO virtio.MMIOOptions
}

// Driver is the guest side of one virtio-mmio device. Its methods are safe
// for concurrent use; each DriverQueue has its own lock.
type Driver struct {
	Mem  *virtio.SliceMemory
	Regs Transport
	IRQ  *IRQ

	mmio     *virtio.MMIO
	opts     Options
	mu       sync.Mutex
	alloc    *allocator
	features uint64
	queues   []*DriverQueue
}

// reservedLow keeps guest address 0 and the first page unused, so a zero
// address in a descriptor is always an error the device must catch.
const reservedLow = 4096

// NewDriver drives an existing transport over mem. irq may be nil when the
// test does not wait on interrupts (Wait then only polls).
func NewDriver(regs Transport, mem *virtio.SliceMemory, irq *IRQ) *Driver {
	if irq == nil {
		irq = NewIRQ()
	}
	return &Driver{Mem: mem, Regs: regs, IRQ: irq, alloc: newAllocator(reservedLow, mem.Size())}
}

// New makes guest memory, an interrupt line and a virtio-mmio transport for
// dev, and a driver for it. Nothing is negotiated yet: call Init.
func New(dev virtio.Device, opts Options) *Driver {
	size := opts.MemSize
	if size <= 0 {
		size = 16 << 20
	}
	mem := virtio.NewSliceMemory(size)
	irq := NewIRQ()
	if opts.MMIO.Logger == nil {
		opts.MMIO.Logger = slog.New(slog.DiscardHandler)
	}
	mmio := virtio.NewMMIO(dev, mem, irq, opts.MMIO)
	d := NewDriver(mmio, mem, irq)
	d.mmio = mmio
	d.opts = opts
	return d
}

// Start is New followed by Init; it fails tb on error and resets the
// device when the test ends, so the device's goroutines stop.
func Start(tb testing.TB, dev virtio.Device, opts Options) *Driver {
	tb.Helper()
	d := New(dev, opts)
	if err := d.Init(); err != nil {
		tb.Fatalf("virtiotest: initialising device type %d: %v", dev.Type(), err)
	}
	tb.Cleanup(d.Reset)
	return d
}

// MMIO returns the transport New created (nil after NewDriver).
func (d *Driver) MMIO() *virtio.MMIO { return d.mmio }

// ReadReg reads a 32-bit transport register.
func (d *Driver) ReadReg(offset uint64) uint32 {
	var b [4]byte
	d.Regs.Read(offset, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

// WriteReg writes a 32-bit transport register.
func (d *Driver) WriteReg(offset uint64, value uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], value)
	d.Regs.Write(offset, b[:])
}

// ReadConfig reads len(p) bytes of the device's configuration space.
func (d *Driver) ReadConfig(offset uint64, p []byte) {
	d.Regs.Read(virtio.MMIOConfig+offset, p)
}

// WriteConfig writes p into the device's configuration space.
func (d *Driver) WriteConfig(offset uint64, p []byte) {
	d.Regs.Write(virtio.MMIOConfig+offset, p)
}

// Status reads the device status register.
func (d *Driver) Status() uint32 { return d.ReadReg(virtio.MMIOStatus) }

// SetStatus writes the device status register.
func (d *Driver) SetStatus(status uint32) { d.WriteReg(virtio.MMIOStatus, status) }

// Features returns the features negotiated by Init or Negotiate.
func (d *Driver) Features() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.features
}

// Reset writes 0 to the status register, which stops the device, then
// forgets the queues and releases their rings and in-flight buffers.
func (d *Driver) Reset() {
	d.SetStatus(0)
	d.mu.Lock()
	queues := d.queues
	d.queues = nil
	d.features = 0
	d.mu.Unlock()
	for _, q := range queues {
		if q != nil {
			q.releaseAll()
		}
	}
}

// Init does what Linux's virtio_mmio driver does at probe: reset,
// ACKNOWLEDGE, DRIVER, feature negotiation, FEATURES_OK, every queue's
// set-up (as Options say), DRIVER_OK.
func (d *Driver) Init() error {
	if magic := d.ReadReg(virtio.MMIOMagicValue); magic != virtio.MMIOMagic {
		return fmt.Errorf("virtiotest: magic value %#x, want %#x", magic, virtio.MMIOMagic)
	}
	if version := d.ReadReg(virtio.MMIOVersion); version != virtio.MMIOVersion2 {
		return fmt.Errorf("virtiotest: transport version %d, want 2", version)
	}
	d.Reset()
	d.SetStatus(virtio.StatusAcknowledge)
	d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
	if _, err := d.Negotiate(^d.opts.RefuseFeatures); err != nil {
		return err
	}
	count := 0
	for count < 1024 {
		d.WriteReg(virtio.MMIOQueueSel, uint32(count))
		if d.ReadReg(virtio.MMIOQueueNumMax) == 0 {
			break
		}
		count++
	}
	skip := map[int]bool{}
	for _, i := range d.opts.SkipQueues {
		skip[i] = true
	}
	d.mu.Lock()
	d.queues = make([]*DriverQueue, count)
	d.mu.Unlock()
	for i := range count {
		if skip[i] {
			continue
		}
		var size uint16
		if i < len(d.opts.QueueSizes) {
			size = d.opts.QueueSizes[i]
		}
		if _, err := d.SetupQueue(i, size); err != nil {
			return err
		}
	}
	return d.DriverOK()
}

// Negotiate reads the offered features, accepts offered&want plus
// VIRTIO_F_VERSION_1, and sets FEATURES_OK; it fails if the device does
// not keep FEATURES_OK set. Status must already have DRIVER.
func (d *Driver) Negotiate(want uint64) (uint64, error) {
	var offered uint64
	for sel := range uint32(2) {
		d.WriteReg(virtio.MMIODeviceFeaturesSel, sel)
		offered |= uint64(d.ReadReg(virtio.MMIODeviceFeatures)) << (32 * sel)
	}
	accepted := offered&want | virtio.FeatureVersion1
	for sel := range uint32(2) {
		d.WriteReg(virtio.MMIODriverFeaturesSel, sel)
		d.WriteReg(virtio.MMIODriverFeatures, uint32(accepted>>(32*sel)))
	}
	d.SetStatus(d.Status() | virtio.StatusFeaturesOK)
	if d.Status()&virtio.StatusFeaturesOK == 0 {
		return 0, fmt.Errorf("virtiotest: device refused features %#x (offered %#x)", accepted, offered)
	}
	d.mu.Lock()
	d.features = accepted
	d.mu.Unlock()
	return accepted, nil
}

// DriverOK sets DRIVER_OK, which activates the device, and checks that
// the device did not answer with DEVICE_NEEDS_RESET.
func (d *Driver) DriverOK() error {
	d.SetStatus(d.Status() | virtio.StatusDriverOK)
	if status := d.Status(); status&virtio.StatusDeviceNeedsReset != 0 || status&virtio.StatusDriverOK == 0 {
		return fmt.Errorf("virtiotest: device not live after DRIVER_OK (status %#x)", status)
	}
	return nil
}

// SetupQueue allocates queue index's rings with size entries (0: the
// maximum the device allows), programs the registers and sets QueueReady.
// It fails if the device does not report the queue ready.
func (d *Driver) SetupQueue(index int, size uint16) (*DriverQueue, error) {
	d.WriteReg(virtio.MMIOQueueSel, uint32(index))
	max := d.ReadReg(virtio.MMIOQueueNumMax)
	if max == 0 {
		return nil, fmt.Errorf("virtiotest: queue %d does not exist", index)
	}
	if size == 0 {
		size = uint16(max)
	}
	layout, err := d.allocRings(size)
	if err != nil {
		return nil, err
	}
	q := newDriverQueue(d, index, layout)
	if err := d.ProgramQueue(index, layout); err != nil {
		q.releaseAll()
		return nil, err
	}
	d.mu.Lock()
	for len(d.queues) <= index {
		d.queues = append(d.queues, nil)
	}
	d.queues[index] = q
	d.mu.Unlock()
	return q, nil
}

// ProgramQueue writes a layout into queue index's registers and sets
// QueueReady, without allocating anything: hostile tests use it with
// layouts the device must refuse. It reports whether the queue became
// ready.
func (d *Driver) ProgramQueue(index int, layout virtio.QueueLayout) error {
	d.WriteReg(virtio.MMIOQueueSel, uint32(index))
	d.WriteReg(virtio.MMIOQueueNum, uint32(layout.Size))
	for _, r := range []struct {
		low  uint64
		addr uint64
	}{{virtio.MMIOQueueDescLow, layout.DescTable}, {virtio.MMIOQueueDriverLow, layout.AvailRing}, {virtio.MMIOQueueDeviceLow, layout.UsedRing}} {
		d.WriteReg(r.low, uint32(r.addr))
		d.WriteReg(r.low+4, uint32(r.addr>>32))
	}
	d.WriteReg(virtio.MMIOQueueReady, 1)
	if d.ReadReg(virtio.MMIOQueueReady) != 1 {
		return fmt.Errorf("virtiotest: device refused queue %d with layout %+v (status %#x)", index, layout, d.Status())
	}
	return nil
}

func (d *Driver) allocRings(size uint16) (virtio.QueueLayout, error) {
	layout := virtio.QueueLayout{Size: size}
	var err error
	if layout.DescTable, err = d.Alloc(virtio.DescriptorSize*uint64(size), 16); err != nil {
		return layout, err
	}
	if layout.AvailRing, err = d.Alloc(6+2*uint64(size), 2); err != nil {
		return layout, err
	}
	if layout.UsedRing, err = d.Alloc(6+8*uint64(size), 4); err != nil {
		return layout, err
	}
	return layout, nil
}

// Queue returns queue i as set up by Init or SetupQueue, or nil.
func (d *Driver) Queue(i int) *DriverQueue {
	d.mu.Lock()
	defer d.mu.Unlock()
	if i < 0 || i >= len(d.queues) {
		return nil
	}
	return d.queues[i]
}

// Notify writes QueueNotify for queue index.
func (d *Driver) Notify(index int) { d.WriteReg(virtio.MMIOQueueNotify, uint32(index)) }

// AckInterrupts reads InterruptStatus, acknowledges every set bit and
// returns them.
func (d *Driver) AckInterrupts() uint32 {
	status := d.ReadReg(virtio.MMIOInterruptStatus)
	if status != 0 {
		d.WriteReg(virtio.MMIOInterruptACK, status)
	}
	return status
}

// Alloc reserves size bytes of guest memory aligned to align (a power of
// two) and returns the guest address.
func (d *Driver) Alloc(size, align uint64) (uint64, error) {
	if align == 0 || align&(align-1) != 0 {
		return 0, errors.New("virtiotest: alignment must be a power of two")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.alloc.alloc(size, align)
}

// Release returns memory from Alloc.
func (d *Driver) Release(addr, size uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.alloc.release(addr, size)
}
