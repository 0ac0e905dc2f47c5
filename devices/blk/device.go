package blk

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// DefaultSerial is the device id string T_GET_ID returns when
// Options.Serial is empty.
const DefaultSerial = "cowork-root"

// Options configure New.
type Options struct {
	// ReadOnly offers the disk read-only (VIRTIO_BLK_F_RO): writes,
	// discards and write-zeroes fail with VIRTIO_BLK_S_IOERR. New's file
	// may then be opened O_RDONLY; otherwise it must be open for writing.
	ReadOnly bool
	// Serial is the id string (at most IDBytes printable ASCII bytes);
	// empty means DefaultSerial. Give each disk of a machine its own, so
	// that the guest's /dev/disk/by-id names differ.
	Serial string
	// Logger receives guest errors (rate-limited) and host I/O errors;
	// nil means slog.Default().
	Logger *slog.Logger
}

// Device is a virtio-blk device over one Backing. Create it with New (a
// raw image file) or NewBacked; it implements virtio.Device.
type Device struct {
	backing  Backing
	readOnly bool
	capacity uint64 // in sectors
	id       [IDBytes]byte
	config   [configSize]byte
	log      *ratelog.Logger // guest errors, rate-limited

	worker virtio.Worker
	mu     sync.Mutex
	irq    virtio.Interrupt // the active driver's, for SignalResized; nil when inactive
}

var _ virtio.Device = (*Device)(nil)

// New returns an inactive device serving file, a raw image whose size is
// a positive multiple of SectorSize (a File backing). The caller keeps
// ownership of file: it must stay open until the device is reset for the
// last time, and the device never closes it.
func New(file *os.File, opts Options) (*Device, error) {
	backing, err := NewFile(file, !opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	return NewBacked(backing, opts)
}

// NewBacked returns an inactive device serving backing, whose size must
// be a positive multiple of SectorSize. The caller keeps ownership of
// backing: it must stay usable until the device is reset for the last
// time.
func NewBacked(backing Backing, opts Options) (*Device, error) {
	if backing == nil {
		return nil, errors.New("virtio-blk: no backing")
	}
	size := backing.Size()
	if size <= 0 || size%SectorSize != 0 {
		return nil, fmt.Errorf("virtio-blk: disk %s is %d bytes, not a positive multiple of the %d-byte sector", backing.Name(), size, SectorSize)
	}
	capacity := uint64(size) / SectorSize
	id, err := serialID(opts.Serial)
	if err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Device{
		backing: backing, readOnly: opts.ReadOnly, capacity: capacity, id: id,
		config: buildConfig(capacity, opts.ReadOnly),
		log:    ratelog.New(logger.With("device", "virtio-blk", "image", backing.Name()), nil),
	}, nil
}

// serialID checks serial and pads it with NULs to IDBytes.
func serialID(serial string) ([IDBytes]byte, error) {
	var id [IDBytes]byte
	if serial == "" {
		serial = DefaultSerial
	}
	if len(serial) > IDBytes {
		return id, fmt.Errorf("virtio-blk: serial %q is longer than %d bytes", serial, IDBytes)
	}
	for _, c := range []byte(serial) {
		if c < 0x20 || c > 0x7e {
			return id, fmt.Errorf("virtio-blk: serial %q is not printable ASCII", serial)
		}
	}
	copy(id[:], serial)
	return id, nil
}

// Capacity is the disk's size in sectors of SectorSize bytes.
func (d *Device) Capacity() uint64 { return d.capacity }

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceTypeBlock }

// Features implements virtio.Device.
func (d *Device) Features() uint64 { return features(d.readOnly) }

// QueueMaxSizes implements virtio.Device: one request queue.
func (d *Device) QueueMaxSizes() []uint16 { return []uint16{QueueSize} }

// ReadConfig implements virtio.Device. The space never changes, so any
// offset and length the guest picks is answered from the fixed copy; bytes
// past its end are left as they are.
func (d *Device) ReadConfig(offset uint64, data []byte) {
	if offset >= configSize {
		return
	}
	copy(data, d.config[offset:])
}

// WriteConfig implements virtio.Device: every field is read-only
// (writeback is writable only with VIRTIO_BLK_F_CONFIG_WCE, not offered).
func (d *Device) WriteConfig(offset uint64, data []byte) {}

// Activate implements virtio.Device: it starts the worker serving the
// request queue. Guest memory must be a virtio.Slicer, since data moves
// between the backing and guest buffers in place.
func (d *Device) Activate(mem virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, features uint64) error {
	if len(queues) != 1 || queues[0] == nil {
		return errors.New("virtio-blk: the driver did not enable the request queue")
	}
	slicer, ok := mem.(virtio.Slicer)
	if !ok {
		return errors.New("virtio-blk: guest memory cannot be mapped (no virtio.Slicer)")
	}
	w := newWorker(d, mem, slicer, queues[0], irq, features)
	if err := d.worker.Start(w.serve); err != nil {
		return err
	}
	d.mu.Lock()
	d.irq = irq
	d.mu.Unlock()
	return nil
}

// SignalResized tells an active driver to read the configuration space
// again: a guest restored from a snapshot was made with the disk as it was
// then, and the image may have grown since (the capacity is the backing's
// size when the device was made).
func (d *Device) SignalResized() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.irq != nil {
		d.irq.SignalConfig()
	}
}

// Notify implements virtio.Device: it wakes the worker, never blocking.
func (d *Device) Notify(queue int) { d.worker.Wake() }

// Reset implements virtio.Device: it stops the worker and waits for it,
// which lets the request in progress (one host I/O) finish first.
func (d *Device) Reset() {
	d.worker.Stop()
	d.mu.Lock()
	d.irq = nil
	d.mu.Unlock()
}
