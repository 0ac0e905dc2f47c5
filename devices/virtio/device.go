package virtio

// Device is one virtio device behind a transport (the crosvm VirtioDevice
// shape). The transport owns the registers, feature negotiation, queue
// set-up and the status state machine; the device sees its queues only once
// the driver is ready, in Activate.
//
// Concurrency: the transport serialises calls to ReadConfig, WriteConfig,
// Activate, Notify and Reset against each other, but they arrive on vCPU
// threads, so none of them may block for long: Notify wakes the device's
// own goroutine rather than doing the work.
type Device interface {
	// Type is the virtio device id (DeviceTypeRNG, DeviceTypeVsock, …).
	Type() uint32
	// Features are the device-specific feature bits offered to the driver
	// (bits 0–23 and any the device itself implements). The transport adds
	// FeatureVersion1 and the ring features its queues support.
	Features() uint64
	// QueueMaxSizes gives, per queue, the largest size the device accepts
	// (a power of two ≤ MaxQueueSize). Its length is the number of queues.
	QueueMaxSizes() []uint16
	// ReadConfig fills data from the device-specific configuration space at
	// offset. offset and len(data) are guest-chosen and unchecked: bytes
	// outside the config space are left as they are (the transport passes
	// zeroed data).
	ReadConfig(offset uint64, data []byte)
	// WriteConfig writes the guest's data at offset of the configuration
	// space; writes outside it or to read-only fields are ignored.
	WriteConfig(offset uint64, data []byte)
	// Activate starts the device once the driver has set DRIVER_OK.
	// queues has one entry per QueueMaxSizes entry, in order; an entry is nil
	// when the driver did not enable that queue. features is the negotiated
	// set (including the transport's bits). An error marks the device
	// DEVICE_NEEDS_RESET. The device keeps mem, irq and queues until Reset.
	Activate(mem GuestMemory, irq Interrupt, queues []*Queue, features uint64) error
	// Notify tells the device that the driver made buffers available on
	// queue (an index into the queues given to Activate, already range
	// checked). Called only between Activate and Reset. Must not block.
	Notify(queue int)
	// Reset stops the device: when it returns, the device's goroutines have
	// stopped using the queues, mem and irq of the last Activate, and the
	// device is ready for another Activate. Called even if Activate was
	// never called or failed.
	Reset()
}

// Quiescer may be implemented by a Device that keeps a chain across
// requests (the balloon's statistics buffer, returned only when the
// device wants new statistics): Quiesce asks it to hand every such chain
// back, so that its transport can be saved (machine.Snapshot, with the
// vCPUs paused, then waits until nothing is in flight). It must not block;
// the driver posts the buffer again when it runs.
type Quiescer interface {
	Quiesce()
}

// StateSaver may be implemented by a Device that keeps state of its own
// across a snapshot (virtio-fs's FUSE session: the node ids the guest
// kernel holds). The transport's state (MMIOState) only re-activates a
// device with its queues where they were; without a StateSaver the device
// starts afresh at that activation, which is right for devices whose
// guest driver holds nothing of theirs (the entropy device).
type StateSaver interface {
	// SaveDeviceState returns the device's own state. It is called with
	// the vCPUs paused and the device's transport quiet (nothing in
	// flight); an error fails the snapshot.
	SaveDeviceState() ([]byte, error)
	// RestoreDeviceState gives a fresh device (never activated) a state
	// SaveDeviceState returned, before its transport's RestoreState
	// activates it; the next Activate goes on from it. The bytes come
	// from a file: a state that does not parse or no longer fits the
	// host is an error, never a panic. An error fails the restore.
	RestoreDeviceState(state []byte) error
}

// Interrupt is how an active device signals the driver; the transport
// provides it to Activate. Safe for concurrent use, never blocks for long.
// After the device is reset, calls on the old Interrupt are ignored.
type Interrupt interface {
	// SignalUsed raises the used-buffer interrupt. Call it after Push when
	// Queue.NeedsInterrupt reports true.
	SignalUsed()
	// SignalConfig tells the driver that the configuration space changed
	// (bumping the config generation) and raises the config interrupt.
	SignalConfig()
	// NeedsReset reports a guest error the device cannot recover from
	// (for example ErrQueueBroken): the transport logs err (rate-limited),
	// sets DEVICE_NEEDS_RESET and raises the config interrupt. The device
	// should stop processing until Reset.
	NeedsReset(err error)
}
