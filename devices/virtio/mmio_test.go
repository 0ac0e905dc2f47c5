package virtio_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

func TestMMIOCmdline(t *testing.T) {
	require.Equal(t, "virtio_mmio.device=4K@0xd0000000:5", virtio.MMIOCmdline(0xd0000000, 5))
}

func TestMMIOIdentity(t *testing.T) {
	dev := newProbeDevice(8, 4)
	d := virtiotest.New(dev, virtiotest.Options{})
	require.EqualValues(t, 0x74726976, d.ReadReg(virtio.MMIOMagicValue))
	require.EqualValues(t, 2, d.ReadReg(virtio.MMIOVersion))
	require.EqualValues(t, 0x42, d.ReadReg(virtio.MMIODeviceID))
	require.EqualValues(t, virtio.MMIOVendor, d.ReadReg(virtio.MMIOVendorID))

	d.WriteReg(virtio.MMIODeviceFeaturesSel, 0)
	low := d.ReadReg(virtio.MMIODeviceFeatures)
	d.WriteReg(virtio.MMIODeviceFeaturesSel, 1)
	high := d.ReadReg(virtio.MMIODeviceFeatures)
	offered := uint64(high)<<32 | uint64(low)
	require.Equal(t, uint64(1<<3)|virtio.FeatureVersion1|virtio.FeatureIndirectDesc|virtio.FeatureEventIdx, offered)
	d.WriteReg(virtio.MMIODeviceFeaturesSel, 2)
	require.Zero(t, d.ReadReg(virtio.MMIODeviceFeatures))

	for i, want := range []uint32{8, 4, 0} {
		d.WriteReg(virtio.MMIOQueueSel, uint32(i))
		require.Equal(t, want, d.ReadReg(virtio.MMIOQueueNumMax), "queue %d", i)
	}
}

func TestMMIOOptionsDropRingFeatures(t *testing.T) {
	m := virtio.NewMMIO(newProbeDevice(), virtio.NewSliceMemory(4096), nil, virtio.MMIOOptions{DisableEventIdx: true, DisableIndirect: true})
	require.Equal(t, uint64(1<<3)|virtio.FeatureVersion1, m.OfferedFeatures())
}

func TestMMIOUnknownAndOddAccesses(t *testing.T) {
	d := virtiotest.New(newProbeDevice(), virtiotest.Options{})
	m := d.MMIO()
	for _, off := range []uint64{0x018, 0x0f0, 0x0c4, virtio.MMIOQueueNotify, virtio.MMIOInterruptACK} {
		require.Zero(t, d.ReadReg(off), "offset %#x", off)
	}
	// Wrong widths and misaligned offsets read zero and change nothing.
	for _, size := range []int{0, 1, 2, 3, 5, 8} {
		b := make([]byte, size)
		for i := range b {
			b[i] = 0xff
		}
		m.Read(virtio.MMIOMagicValue, b)
		require.Equal(t, make([]byte, size), b)
		m.Write(virtio.MMIOStatus, b)
	}
	m.Read(2, make([]byte, 4))
	m.Write(virtio.MMIOStatus+1, []byte{1, 0, 0, 0})
	require.Zero(t, d.Status())
	// Beyond the window.
	m.Read(virtio.MMIOSize, make([]byte, 4))
	m.Write(1<<62, make([]byte, 4))
	m.Read(^uint64(0), make([]byte, 4))
	// Writes to read-only registers are ignored.
	d.WriteReg(virtio.MMIOMagicValue, 0)
	require.EqualValues(t, virtio.MMIOMagic, d.ReadReg(virtio.MMIOMagicValue))
}

func TestMMIOConfigSpace(t *testing.T) {
	dev := newProbeDevice()
	d := virtiotest.New(dev, virtiotest.Options{})
	b := make([]byte, 4)
	d.ReadConfig(2, b)
	require.Equal(t, []byte{3, 4, 5, 6}, b)
	d.WriteConfig(0, []byte{9})
	one := make([]byte, 1)
	d.ReadConfig(0, one)
	require.EqualValues(t, 9, one[0])
	// Past the device's config: zeros, and the device sees the offset.
	d.ReadConfig(100, b)
	require.Equal(t, make([]byte, 4), b)
	require.Zero(t, d.ReadReg(virtio.MMIOConfigGeneration))
}

func TestMMIOFeatureNegotiation(t *testing.T) {
	cases := map[string]struct {
		accept uint64
		ok     bool
	}{
		"version 1 only":      {virtio.FeatureVersion1, true},
		"everything offered":  {1<<3 | virtio.FeatureVersion1 | virtio.FeatureEventIdx | virtio.FeatureIndirectDesc, true},
		"legacy driver":       {1 << 3, false},
		"feature not offered": {virtio.FeatureVersion1 | 1<<5, false},
		"access platform bit": {virtio.FeatureVersion1 | virtio.FeatureAccessPlatform, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := virtiotest.New(newProbeDevice(), virtiotest.Options{})
			d.SetStatus(virtio.StatusAcknowledge)
			d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
			for sel := range uint32(2) {
				d.WriteReg(virtio.MMIODriverFeaturesSel, sel)
				d.WriteReg(virtio.MMIODriverFeatures, uint32(tc.accept>>(32*sel)))
			}
			d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK)
			require.Equal(t, tc.ok, d.Status()&virtio.StatusFeaturesOK != 0)
		})
	}
}

func TestMMIOFeaturesSelectAboveOneIsPoison(t *testing.T) {
	d := virtiotest.New(newProbeDevice(), virtiotest.Options{})
	d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
	d.WriteReg(virtio.MMIODriverFeaturesSel, 1)
	d.WriteReg(virtio.MMIODriverFeatures, 1)
	d.WriteReg(virtio.MMIODriverFeaturesSel, 7)
	d.WriteReg(virtio.MMIODriverFeatures, 1)
	d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK)
	require.Zero(t, d.Status()&virtio.StatusFeaturesOK)
}

func TestMMIOStatusStateMachine(t *testing.T) {
	dev := newProbeDevice()
	d := virtiotest.New(dev, virtiotest.Options{})
	// DRIVER before ACKNOWLEDGE is refused.
	d.SetStatus(virtio.StatusDriver)
	require.Zero(t, d.Status())
	d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
	// DRIVER_OK before FEATURES_OK does not activate.
	d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusDriverOK)
	require.Zero(t, d.Status()&virtio.StatusDriverOK)
	require.Zero(t, dev.activated)
	_, err := d.Negotiate(^uint64(0))
	require.NoError(t, err)
	// Clearing a bit without a reset is ignored.
	d.SetStatus(virtio.StatusAcknowledge)
	require.NotZero(t, d.Status()&virtio.StatusFeaturesOK)
	_, err = d.SetupQueue(0, 0)
	require.NoError(t, err)
	require.NoError(t, d.DriverOK())
	require.Equal(t, 1, dev.activated)
	require.NotZero(t, dev.negotiated&virtio.FeatureVersion1)
	// Writing 0 resets the device and every register.
	d.SetStatus(0)
	require.Zero(t, d.Status())
	require.Equal(t, 1, dev.resets)
	d.WriteReg(virtio.MMIOQueueSel, 0)
	require.Zero(t, d.ReadReg(virtio.MMIOQueueReady))
	require.Zero(t, d.ReadReg(virtio.MMIOQueueNum))
	// And it comes back.
	require.NoError(t, d.Init())
	require.Equal(t, 2, dev.activated)
}

func TestMMIOActivateErrorNeedsReset(t *testing.T) {
	dev := newProbeDevice()
	dev.activateErr = errors.New("no backend")
	d := virtiotest.New(dev, virtiotest.Options{})
	err := d.Init()
	require.Error(t, err)
	require.NotZero(t, d.Status()&virtio.StatusDeviceNeedsReset)
	require.NotZero(t, d.AckInterrupts()&virtio.InterruptConfigChange)
	require.EqualValues(t, 1, d.ReadReg(virtio.MMIOConfigGeneration))
	// Notify on a device that never became active is ignored.
	d.Notify(0)
	require.Empty(t, dev.notified)
}

func TestMMIOQueueSizeNotPowerOfTwo(t *testing.T) {
	for name, size := range map[string]uint16{"not a power of two": 6, "above max": 32, "zero": 0} {
		t.Run(name, func(t *testing.T) {
			d := virtiotest.New(newProbeDevice(16), virtiotest.Options{})
			d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
			_, err := d.Negotiate(^uint64(0))
			require.NoError(t, err)
			desc, err := d.Alloc(16*64, 16)
			require.NoError(t, err)
			avail, err := d.Alloc(6+2*64, 2)
			require.NoError(t, err)
			used, err := d.Alloc(6+8*64, 4)
			require.NoError(t, err)
			err = d.ProgramQueue(0, virtio.QueueLayout{Size: size, DescTable: desc, AvailRing: avail, UsedRing: used})
			require.Error(t, err)
			require.NotZero(t, d.Status()&virtio.StatusDeviceNeedsReset)
			d.WriteReg(virtio.MMIOQueueSel, 0)
			require.Zero(t, d.ReadReg(virtio.MMIOQueueReady))
		})
	}
}

func TestMMIOQueueOutsideMemoryRefused(t *testing.T) {
	d := virtiotest.New(newProbeDevice(16), virtiotest.Options{})
	d.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
	_, err := d.Negotiate(^uint64(0))
	require.NoError(t, err)
	err = d.ProgramQueue(0, virtio.QueueLayout{Size: 16, DescTable: 1 << 40, AvailRing: 0x2000, UsedRing: 0x3000})
	require.Error(t, err)
	require.NotZero(t, d.Status()&virtio.StatusDeviceNeedsReset)
	// DRIVER_OK after NEEDS_RESET does not activate.
	dev := d.MMIO().Device().(*probeDevice)
	d.SetStatus(d.Status() | virtio.StatusDriverOK)
	require.Zero(t, dev.activated)
}

func TestMMIOQueueRegistersLockedAfterDriverOK(t *testing.T) {
	_, d := setup(t, virtiotest.Options{})
	layout := d.Queue(0).Layout()
	d.WriteReg(virtio.MMIOQueueSel, 0)
	d.WriteReg(virtio.MMIOQueueNum, 2)
	d.WriteReg(virtio.MMIOQueueDescLow, 0x5000)
	d.WriteReg(virtio.MMIOQueueReady, 0)
	require.EqualValues(t, layout.Size, d.ReadReg(virtio.MMIOQueueNum))
	require.EqualValues(t, uint32(layout.DescTable), d.ReadReg(virtio.MMIOQueueDescLow))
	require.EqualValues(t, uint32(layout.AvailRing), d.ReadReg(virtio.MMIOQueueDriverLow))
	require.EqualValues(t, uint32(layout.UsedRing), d.ReadReg(virtio.MMIOQueueDeviceLow))
	require.EqualValues(t, 1, d.ReadReg(virtio.MMIOQueueReady))
}

func TestMMIONotify(t *testing.T) {
	dev := newProbeDevice(8, 8)
	d := virtiotest.New(dev, virtiotest.Options{SkipQueues: []int{1}})
	// Before DRIVER_OK: ignored.
	d.Notify(0)
	require.Empty(t, dev.notified)
	require.NoError(t, d.Init())
	d.Notify(0)
	d.Notify(1)       // not enabled
	d.Notify(7)       // no such queue
	d.Notify(1 << 16) // high bits (notification data) are not a queue index
	require.Equal(t, []int{0, 0}, dev.notified)
	// Activate saw a nil entry for the disabled queue.
	require.Len(t, dev.queues, 2)
	require.Nil(t, dev.queues[1])
}

func TestMMIOInterrupts(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{})
	irq := dev.interrupt()
	before := d.IRQ.Count()
	irq.SignalUsed()
	require.Equal(t, before+1, d.IRQ.Count())
	require.EqualValues(t, virtio.InterruptUsedBuffer, d.MMIO().InterruptStatus())
	irq.SignalConfig()
	require.EqualValues(t, virtio.InterruptUsedBuffer|virtio.InterruptConfigChange, d.MMIO().InterruptStatus())
	require.EqualValues(t, 1, d.ReadReg(virtio.MMIOConfigGeneration))
	// InterruptACK clears the bits it names...
	d.WriteReg(virtio.MMIOInterruptACK, virtio.InterruptUsedBuffer)
	require.EqualValues(t, virtio.InterruptConfigChange, d.MMIO().InterruptStatus())
	d.WriteReg(virtio.MMIOInterruptACK, 0xffffffff)
	require.Zero(t, d.MMIO().InterruptStatus())

	// ...and so does the read of InterruptStatus, for the bits it returns
	// (Linux's handler then ACKs those same bits, which KVM may absorb).
	irq.SignalUsed()
	irq.SignalConfig()
	require.EqualValues(t, virtio.InterruptUsedBuffer|virtio.InterruptConfigChange, d.ReadReg(virtio.MMIOInterruptStatus))
	require.Zero(t, d.ReadReg(virtio.MMIOInterruptStatus), "a second read finds nothing new")
	irq.SignalUsed() // raised after the read: kept for the next one, whatever the ACK of the old bits
	d.WriteReg(virtio.MMIOInterruptACK, virtio.InterruptConfigChange)
	require.EqualValues(t, virtio.InterruptUsedBuffer, d.ReadReg(virtio.MMIOInterruptStatus))
	for _, v := range virtio.AckValues() {
		require.Zero(t, v&^(virtio.InterruptUsedBuffer|virtio.InterruptConfigChange), "an ACK value carries only interrupt bits")
	}

	// After a reset the old Interrupt is dead.
	d.Reset()
	count := d.IRQ.Count()
	irq.SignalUsed()
	irq.NeedsReset(errors.New("late"))
	require.Equal(t, count, d.IRQ.Count())
	require.Zero(t, d.Status())
}

func TestMMIOHostReset(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{})
	resets := dev.resets
	d.MMIO().Reset()
	require.Equal(t, resets+1, dev.resets)
	require.Nil(t, dev.queues)
	require.Zero(t, d.Status())
}

func TestMMIOEndToEndThroughRegisters(t *testing.T) {
	dev, d := setup(t, virtiotest.Options{})
	dq := d.Queue(0)
	head, err := dq.Add(virtiotest.Readable([]byte{1, 2, 3, 4}), virtiotest.Writable(4))
	require.NoError(t, err)
	dq.Kick()
	require.Equal(t, []int{0}, dev.notified)
	q := dev.queue(t, 0)
	c, err := q.Pop()
	require.NoError(t, err)
	var v [4]byte
	_, err = c.Reader().Read(v[:])
	require.NoError(t, err)
	binary.LittleEndian.PutUint32(v[:], binary.LittleEndian.Uint32(v[:])+1)
	_, err = c.Writer().Write(v[:])
	require.NoError(t, err)
	require.NoError(t, q.Complete(c, c.Writer().Written(), dev.interrupt()))
	used, err := dq.Wait(waitTimeout)
	require.NoError(t, err)
	require.Equal(t, head, used.Head)
	require.Equal(t, []byte{2, 2, 3, 4}, used.Data)
	require.NotZero(t, d.AckInterrupts()&virtio.InterruptUsedBuffer)
}

func TestMMIOGuestMisbehaviourIsLoggedRateLimited(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	m := virtio.NewMMIO(newProbeDevice(), virtio.NewSliceMemory(4096), nil, virtio.MMIOOptions{Logger: logs.Logger()})
	for range 100 {
		m.Read(virtio.MMIOMagicValue+1, make([]byte, 4))
	}
	lines := logs.Lines("virtio-mmio: register read with bad width or alignment")
	require.Len(t, lines, ratelog.DefaultBurst, logs.String())
	require.Contains(t, lines[0], "virtio_device=66")
}
