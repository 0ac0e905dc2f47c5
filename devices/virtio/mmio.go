package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cowork-vmm/cowork-vmm/devices"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// virtio-mmio version 2 register offsets (virtio 1.2 §4.2.2).
const (
	MMIOMagicValue        = 0x000
	MMIOVersion           = 0x004
	MMIODeviceID          = 0x008
	MMIOVendorID          = 0x00c
	MMIODeviceFeatures    = 0x010
	MMIODeviceFeaturesSel = 0x014
	MMIODriverFeatures    = 0x020
	MMIODriverFeaturesSel = 0x024
	MMIOQueueSel          = 0x030
	MMIOQueueNumMax       = 0x034
	MMIOQueueNum          = 0x038
	MMIOQueueReady        = 0x044
	MMIOQueueNotify       = 0x050
	MMIOInterruptStatus   = 0x060
	MMIOInterruptACK      = 0x064
	MMIOStatus            = 0x070
	MMIOQueueDescLow      = 0x080
	MMIOQueueDescHigh     = 0x084
	MMIOQueueDriverLow    = 0x090
	MMIOQueueDriverHigh   = 0x094
	MMIOQueueDeviceLow    = 0x0a0
	MMIOQueueDeviceHigh   = 0x0a4
	MMIOSHMSel            = 0x0ac
	MMIOSHMLenLow         = 0x0b0
	MMIOSHMLenHigh        = 0x0b4
	MMIOSHMBaseLow        = 0x0b8
	MMIOSHMBaseHigh       = 0x0bc
	MMIOQueueReset        = 0x0c0
	MMIOConfigGeneration  = 0x0fc
	MMIOConfig            = 0x100
)

const (
	// MMIOMagic is "virt" in little endian, the value of MagicValue.
	MMIOMagic = 0x74726976
	// MMIOVersion2 is the (non-legacy) virtio-mmio version implemented.
	MMIOVersion2 = 2
	// MMIOVendor is our VendorID: "CWVM" in little endian.
	MMIOVendor = 0x4d565743
	// MMIOSize is the size of one device's MMIO window, registers and
	// config space included.
	MMIOSize = 0x1000
)

// MMIOCmdline returns the kernel command-line entry that tells Linux's
// virtio_mmio driver about a device at base using interrupt line irq
// (CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES), e.g.
// "virtio_mmio.device=4K@0xd0000000:5".
func MMIOCmdline(base uint64, irq uint32) string {
	return fmt.Sprintf("virtio_mmio.device=4K@%#x:%d", base, irq)
}

// MMIOOptions tune an MMIO transport. The zero value is the default.
type MMIOOptions struct {
	// Logger receives (rate-limited) reports of guest misbehaviour;
	// nil means slog.Default().
	Logger *slog.Logger
	// DisableEventIdx stops offering VIRTIO_F_EVENT_IDX.
	DisableEventIdx bool
	// DisableIndirect stops offering VIRTIO_F_INDIRECT_DESC.
	DisableIndirect bool
}

// queueState is the driver's set-up of one queue, as written to the
// registers, and the queue made from it once ready.
type queueState struct {
	maxSize uint16
	layout  QueueLayout
	queue   *Queue // non-nil once QueueReady was accepted
}

// MMIO is the virtio-mmio version 2 transport for one Device: a bus device
// of MMIOSize bytes. Read and Write are safe for concurrent use from vCPU
// threads and never panic, whatever the guest writes; unknown or misaligned
// register accesses read as zero and are ignored.
type MMIO struct {
	dev     Device
	mem     GuestMemory
	irq     devices.IRQ
	log     *ratelog.Logger // guest misbehaviour, rate-limited
	offered uint64

	// Read without mu by the Interrupt given to the device, so that a
	// device can signal while the transport holds mu (e.g. in Reset).
	status    atomic.Uint32
	intStatus atomic.Uint32
	configGen atomic.Uint32

	mu             sync.Mutex
	deviceFeatSel  uint32
	driverFeatSel  uint32
	driverFeatures uint64
	negotiated     uint64
	queueSel       uint32
	queues         []queueState
	active         *mmioInterrupt // non-nil while the device is activated
}

// NewMMIO puts dev behind a virtio-mmio transport that reads the driver's
// rings from mem and raises irq for used-buffer and config interrupts.
func NewMMIO(dev Device, mem GuestMemory, irq devices.IRQ, opts MMIOOptions) *MMIO {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	m := &MMIO{dev: dev, mem: mem, irq: irq, log: ratelog.New(log.With("virtio_device", dev.Type()), nil)}
	m.offered = dev.Features() | FeatureVersion1
	if !opts.DisableEventIdx {
		m.offered |= FeatureEventIdx
	}
	if !opts.DisableIndirect {
		m.offered |= FeatureIndirectDesc
	}
	m.offered &^= FeatureAccessPlatform
	for _, size := range dev.QueueMaxSizes() {
		m.queues = append(m.queues, queueState{maxSize: min(size, MaxQueueSize)})
	}
	return m
}

// Device returns the device behind the transport.
func (m *MMIO) Device() Device { return m.dev }

// Status returns the device status register.
func (m *MMIO) Status() uint32 { return m.status.Load() }

// InterruptStatus returns the pending interrupt bits.
func (m *MMIO) InterruptStatus() uint32 { return m.intStatus.Load() }

// OfferedFeatures returns every feature bit the transport offers.
func (m *MMIO) OfferedFeatures() uint64 { return m.offered }

// Reset stops the device from the host side, as if the driver had written
// 0 to Status. The VMM calls it when the VM stops.
func (m *MMIO) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.resetLocked()
}

// Read implements the bus device read.
func (m *MMIO) Read(offset uint64, data []byte) {
	clear(data)
	if offset >= MMIOConfig {
		if offset >= MMIOSize {
			return
		}
		m.mu.Lock()
		m.dev.ReadConfig(offset-MMIOConfig, data)
		m.mu.Unlock()
		return
	}
	if len(data) != 4 || offset%4 != 0 {
		m.log.Warn("virtio-mmio: register read with bad width or alignment", "offset", offset, "len", len(data))
		return
	}
	binary.LittleEndian.PutUint32(data, m.readRegister(offset))
}

func (m *MMIO) readRegister(offset uint64) uint32 {
	switch offset {
	case MMIOMagicValue:
		return MMIOMagic
	case MMIOVersion:
		return MMIOVersion2
	case MMIODeviceID:
		return m.dev.Type()
	case MMIOVendorID:
		return MMIOVendor
	case MMIOInterruptStatus:
		// A read acknowledges what it returns, as virtio-pci's ISR does.
		// Linux's handler reads this register and writes the same bits to
		// InterruptACK, so nothing changes for it; but the ACK then
		// carries no information, and a VMM can let KVM absorb it
		// (AckValues) instead of paying an exit per interrupt. Bits raised
		// after the read stay set for the next one.
		return m.intStatus.Swap(0)
	case MMIOStatus:
		return m.status.Load()
	case MMIOConfigGeneration:
		return m.configGen.Load()
	case MMIOSHMLenLow, MMIOSHMLenHigh:
		return 0xffffffff // no shared memory regions
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch offset {
	case MMIODeviceFeatures:
		switch m.deviceFeatSel {
		case 0:
			return uint32(m.offered)
		case 1:
			return uint32(m.offered >> 32)
		}
		return 0
	case MMIOQueueNumMax:
		if q := m.selectedQueue(); q != nil {
			return uint32(q.maxSize)
		}
	case MMIOQueueNum:
		if q := m.selectedQueue(); q != nil {
			return uint32(q.layout.Size)
		}
	case MMIOQueueReady:
		if q := m.selectedQueue(); q != nil && q.queue != nil {
			return 1
		}
	case MMIOQueueDescLow, MMIOQueueDescHigh, MMIOQueueDriverLow, MMIOQueueDriverHigh, MMIOQueueDeviceLow, MMIOQueueDeviceHigh:
		if q := m.selectedQueue(); q != nil {
			return queueAddressHalf(q, offset)
		}
	}
	return 0
}

// queueAddressHalf returns the half of a ring address a register shows.
func queueAddressHalf(q *queueState, offset uint64) uint32 {
	var addr uint64
	switch offset &^ 7 {
	case MMIOQueueDescLow:
		addr = q.layout.DescTable
	case MMIOQueueDriverLow:
		addr = q.layout.AvailRing
	case MMIOQueueDeviceLow:
		addr = q.layout.UsedRing
	}
	if offset%8 == 4 {
		return uint32(addr >> 32)
	}
	return uint32(addr)
}

func (m *MMIO) selectedQueue() *queueState {
	if m.queueSel >= uint32(len(m.queues)) {
		return nil
	}
	return &m.queues[m.queueSel]
}

// Write implements the bus device write.
func (m *MMIO) Write(offset uint64, data []byte) {
	if offset >= MMIOConfig {
		if offset >= MMIOSize {
			return
		}
		m.mu.Lock()
		m.dev.WriteConfig(offset-MMIOConfig, data)
		m.mu.Unlock()
		return
	}
	if len(data) != 4 || offset%4 != 0 {
		m.log.Warn("virtio-mmio: register write with bad width or alignment", "offset", offset, "len", len(data))
		return
	}
	value := binary.LittleEndian.Uint32(data)
	switch offset {
	case MMIOInterruptACK:
		m.intStatus.And(^value)
		return
	case MMIOQueueNotify:
		m.notify(value)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch offset {
	case MMIODeviceFeaturesSel:
		m.deviceFeatSel = value
	case MMIODriverFeaturesSel:
		m.driverFeatSel = value
	case MMIODriverFeatures:
		m.writeDriverFeatures(value)
	case MMIOQueueSel:
		m.queueSel = value
	case MMIOQueueNum, MMIOQueueReady, MMIOQueueDescLow, MMIOQueueDescHigh, MMIOQueueDriverLow, MMIOQueueDriverHigh, MMIOQueueDeviceLow, MMIOQueueDeviceHigh:
		m.writeQueueRegister(offset, value)
	case MMIOStatus:
		m.writeStatus(value)
	case MMIOSHMSel, MMIOQueueReset:
		// No shared memory regions, VIRTIO_F_RING_RESET not offered.
	default:
		m.log.Warn("virtio-mmio: write to a read-only or unknown register", "offset", offset)
	}
}

func (m *MMIO) writeDriverFeatures(value uint32) {
	status := m.status.Load()
	if status&StatusDriver == 0 || status&StatusFeaturesOK != 0 {
		m.log.Warn("virtio-mmio: driver features written outside feature negotiation", "status", status)
		return
	}
	switch m.driverFeatSel {
	case 0:
		m.driverFeatures = m.driverFeatures&^0xffffffff | uint64(value)
	case 1:
		m.driverFeatures = m.driverFeatures&0xffffffff | uint64(value)<<32
	default:
		if value != 0 {
			m.log.Warn("virtio-mmio: driver accepted features the device never offered", "select", m.driverFeatSel, "value", value)
			m.driverFeatures |= 1 << 63 // poison: FEATURES_OK will fail
		}
	}
}

func (m *MMIO) writeQueueRegister(offset uint64, value uint32) {
	status := m.status.Load()
	if status&StatusFeaturesOK == 0 || status&StatusDriverOK != 0 {
		m.log.Warn("virtio-mmio: queue register written outside queue set-up", "offset", offset, "status", status)
		return
	}
	q := m.selectedQueue()
	if q == nil {
		m.log.Warn("virtio-mmio: queue register written for a queue that does not exist", "queue", m.queueSel)
		return
	}
	if offset == MMIOQueueReady {
		m.writeQueueReady(q, value)
		return
	}
	if q.queue != nil {
		m.log.Warn("virtio-mmio: queue register written while the queue is ready", "queue", m.queueSel, "offset", offset)
		return
	}
	setLow := func(addr *uint64) { *addr = *addr&^0xffffffff | uint64(value) }
	setHigh := func(addr *uint64) { *addr = *addr&0xffffffff | uint64(value)<<32 }
	switch offset {
	case MMIOQueueNum:
		if value > 0xffff {
			value = 0 // refused when the queue is made ready
		}
		q.layout.Size = uint16(value)
	case MMIOQueueDescLow:
		setLow(&q.layout.DescTable)
	case MMIOQueueDescHigh:
		setHigh(&q.layout.DescTable)
	case MMIOQueueDriverLow:
		setLow(&q.layout.AvailRing)
	case MMIOQueueDriverHigh:
		setHigh(&q.layout.AvailRing)
	case MMIOQueueDeviceLow:
		setLow(&q.layout.UsedRing)
	case MMIOQueueDeviceHigh:
		setHigh(&q.layout.UsedRing)
	}
}

func (m *MMIO) writeQueueReady(q *queueState, value uint32) {
	if value == 0 {
		q.queue = nil
		return
	}
	if q.queue != nil {
		return
	}
	err := q.layout.Validate(q.maxSize)
	var queue *Queue
	if err == nil {
		queue, err = NewQueue(m.mem, q.layout, m.negotiated)
	}
	if err != nil {
		m.needsReset(fmt.Errorf("queue %d not made ready: %w", m.queueSel, err))
		return
	}
	q.queue = queue
}

func (m *MMIO) writeStatus(value uint32) {
	if value == 0 {
		m.resetLocked()
		return
	}
	current := m.status.Load()
	value &^= StatusDeviceNeedsReset // device-owned bit
	if cleared := current &^ StatusDeviceNeedsReset &^ value; cleared != 0 {
		m.log.Warn("virtio-mmio: driver cleared status bits without a reset", "status", current, "written", value)
		return
	}
	added := value &^ current
	if added&StatusDriver != 0 && value&StatusAcknowledge == 0 {
		m.log.Warn("virtio-mmio: DRIVER set before ACKNOWLEDGE", "written", value)
		return
	}
	if added&StatusFeaturesOK != 0 {
		if err := m.checkFeatures(value); err != nil {
			m.log.Warn("virtio-mmio: refusing FEATURES_OK", "err", err)
			value &^= StatusFeaturesOK
		} else {
			m.negotiated = m.driverFeatures
		}
	}
	if added&StatusDriverOK != 0 && value&StatusFeaturesOK == 0 {
		m.log.Warn("virtio-mmio: DRIVER_OK set before FEATURES_OK", "written", value)
		value &^= StatusDriverOK
		added &^= StatusDriverOK
	}
	m.status.Or(value)
	if added&StatusDriverOK != 0 && current&StatusDeviceNeedsReset == 0 {
		m.activateLocked()
	}
}

func (m *MMIO) checkFeatures(status uint32) error {
	switch {
	case status&StatusDriver == 0:
		return errors.New("FEATURES_OK before DRIVER")
	case m.driverFeatures&^m.offered != 0:
		return fmt.Errorf("driver accepted features %#x the device did not offer", m.driverFeatures&^m.offered)
	case m.driverFeatures&FeatureVersion1 == 0:
		return errors.New("driver did not accept VIRTIO_F_VERSION_1 (legacy drivers are not supported)")
	}
	return nil
}

func (m *MMIO) activateLocked() {
	queues := make([]*Queue, len(m.queues))
	for i := range m.queues {
		queues[i] = m.queues[i].queue
	}
	irq := &mmioInterrupt{m: m}
	if err := m.dev.Activate(m.mem, irq, queues, m.negotiated); err != nil {
		m.needsReset(fmt.Errorf("activating the device: %w", err))
		return
	}
	m.active = irq
}

func (m *MMIO) resetLocked() {
	if m.active != nil {
		m.active.revoked.Store(true)
		m.active = nil
	}
	m.dev.Reset()
	m.status.Store(0)
	m.intStatus.Store(0)
	m.deviceFeatSel, m.driverFeatSel, m.queueSel = 0, 0, 0
	m.driverFeatures, m.negotiated = 0, 0
	for i := range m.queues {
		m.queues[i] = queueState{maxSize: m.queues[i].maxSize}
	}
}

// AckValues are the values a driver writes to InterruptACK: the bits it
// read from InterruptStatus, which that read already acknowledged. A VMM
// may have KVM absorb these writes (vmm.VM.AbsorbMMIOWrite) so they cost
// no exit; any other value still reaches the transport.
func AckValues() []uint32 {
	return []uint32{InterruptUsedBuffer, InterruptConfigChange, InterruptUsedBuffer | InterruptConfigChange}
}

// NotifyQueue is the driver's notify of queue index, delivered some way
// other than a write to the QueueNotify register (an ioeventfd on it): the
// same checks, then the device's Notify.
func (m *MMIO) NotifyQueue(index uint32) { m.notify(index) }

func (m *MMIO) notify(value uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active == nil {
		m.log.Warn("virtio-mmio: queue notify while the device is not active", "queue", value, "status", m.status.Load())
		return
	}
	if m.status.Load()&StatusDeviceNeedsReset != 0 {
		return
	}
	index := value & 0xffff // without VIRTIO_F_NOTIFICATION_DATA, the queue index
	if index >= uint32(len(m.queues)) || m.queues[index].queue == nil {
		m.log.Warn("virtio-mmio: notify for a queue that is not ready", "queue", index)
		return
	}
	m.dev.Notify(int(index))
}

// raise sets interrupt status bits and pulses the interrupt line.
func (m *MMIO) raise(bits uint32) {
	m.intStatus.Or(bits)
	if m.irq == nil {
		return
	}
	if err := m.irq.Trigger(); err != nil {
		m.log.Warn("virtio-mmio: raising the interrupt line failed", "err", err)
	}
}

// needsReset marks the device DEVICE_NEEDS_RESET and tells the driver.
func (m *MMIO) needsReset(err error) {
	m.log.Warn("virtio-mmio: device needs reset", "err", err)
	m.status.Or(StatusDeviceNeedsReset)
	m.configGen.Add(1)
	m.raise(InterruptConfigChange)
}

// mmioInterrupt is the Interrupt of one activation; it goes quiet once the
// device is reset, so a late call from a stopping goroutine changes nothing.
type mmioInterrupt struct {
	m       *MMIO
	revoked atomic.Bool
}

func (i *mmioInterrupt) SignalUsed() {
	if !i.revoked.Load() {
		i.m.raise(InterruptUsedBuffer)
	}
}

func (i *mmioInterrupt) SignalConfig() {
	if !i.revoked.Load() {
		i.m.configGen.Add(1)
		i.m.raise(InterruptConfigChange)
	}
}

func (i *mmioInterrupt) NeedsReset(err error) {
	if !i.revoked.Load() {
		i.m.needsReset(err)
	}
}
