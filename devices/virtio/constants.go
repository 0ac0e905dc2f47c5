package virtio

// Device types (virtio 1.2 §5), as returned by Device.Type.
const (
	DeviceTypeNet     uint32 = 1
	DeviceTypeBlock   uint32 = 2
	DeviceTypeConsole uint32 = 3
	DeviceTypeRNG     uint32 = 4
	DeviceTypeBalloon uint32 = 5
	DeviceType9P      uint32 = 9
	DeviceTypeVsock   uint32 = 19
	DeviceTypeFS      uint32 = 26
)

// Reserved feature bits (virtio 1.2 §6). Device.Features returns only
// device-specific bits (0–23); the transport adds the ones below that the
// queue implementation supports.
const (
	FeatureIndirectDesc   uint64 = 1 << 28 // VIRTIO_F_INDIRECT_DESC
	FeatureEventIdx       uint64 = 1 << 29 // VIRTIO_F_EVENT_IDX
	FeatureVersion1       uint64 = 1 << 32 // VIRTIO_F_VERSION_1
	FeatureAccessPlatform uint64 = 1 << 33 // VIRTIO_F_ACCESS_PLATFORM (never offered)
)

// Device status bits (virtio 1.2 §2.1).
const (
	StatusAcknowledge      uint32 = 1
	StatusDriver           uint32 = 2
	StatusDriverOK         uint32 = 4
	StatusFeaturesOK       uint32 = 8
	StatusDeviceNeedsReset uint32 = 64
	StatusFailed           uint32 = 128
)

// Interrupt status bits of the virtio-mmio InterruptStatus register.
const (
	InterruptUsedBuffer   uint32 = 1
	InterruptConfigChange uint32 = 2
)

// Descriptor flags (virtio 1.2 §2.7.5).
const (
	DescFlagNext     uint16 = 1
	DescFlagWrite    uint16 = 2
	DescFlagIndirect uint16 = 4
)

// Ring flags.
const (
	AvailFlagNoInterrupt uint16 = 1 // VIRTQ_AVAIL_F_NO_INTERRUPT
	UsedFlagNoNotify     uint16 = 1 // VIRTQ_USED_F_NO_NOTIFY
)

// Limits.
const (
	// MaxQueueSize is the largest split virtqueue the spec allows.
	MaxQueueSize = 32768
	// DescriptorSize is the size in bytes of one descriptor in guest memory.
	DescriptorSize = 16
	// MaxChainBytes caps the total length of one chain's buffers (readable
	// plus writable). Larger chains are refused as a ChainError.
	MaxChainBytes = 64 << 20
)
