package blk

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// DefaultSerial is the device id string T_GET_ID returns when
// Options.Serial is empty.
const DefaultSerial = "cowork-root"

// Options configure New.
type Options struct {
	// ReadOnly offers the disk read-only (VIRTIO_BLK_F_RO): writes,
	// discards and write-zeroes fail with VIRTIO_BLK_S_IOERR. The file
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

// Device is a virtio-blk device over one image file. Create it with New;
// it implements virtio.Device.
type Device struct {
	file     *os.File
	raw      syscall.RawConn // the file's descriptor, held open per call
	readOnly bool
	capacity uint64 // in sectors
	id       [IDBytes]byte
	config   [configSize]byte
	log      *ratelog.Logger // guest errors, rate-limited

	// fallocate is unix.Fallocate; tests replace it to play a host
	// filesystem without hole punching or zero ranges.
	fallocate func(fd int, mode uint32, off, size int64) error

	worker virtio.Worker
	mu     sync.Mutex
	irq    virtio.Interrupt // the active driver's, for SignalResized; nil when inactive
}

var _ virtio.Device = (*Device)(nil)

// New returns an inactive device serving file, a raw image whose size is
// a positive multiple of SectorSize. The caller keeps ownership of file:
// it must stay open until the device is reset for the last time, and the
// device never closes it.
func New(file *os.File, opts Options) (*Device, error) {
	if file == nil {
		return nil, errors.New("virtio-blk: no image file")
	}
	capacity, err := imageSectors(file)
	if err != nil {
		return nil, err
	}
	raw, err := file.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("virtio-blk: image %s: %w", file.Name(), err)
	}
	if !opts.ReadOnly {
		if err := checkWritable(raw, file.Name()); err != nil {
			return nil, err
		}
	}
	id, err := serialID(opts.Serial)
	if err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Device{
		file: file, raw: raw, readOnly: opts.ReadOnly, capacity: capacity, id: id,
		config:    buildConfig(capacity, opts.ReadOnly),
		log:       ratelog.New(logger.With("device", "virtio-blk", "image", file.Name()), nil),
		fallocate: unix.Fallocate,
	}, nil
}

// imageSectors returns the capacity of the image in sectors, refusing
// what is not a regular file of a whole, positive number of sectors.
func imageSectors(file *os.File) (uint64, error) {
	info, err := file.Stat()
	if err != nil {
		return 0, fmt.Errorf("virtio-blk: image %s: %w", file.Name(), err)
	}
	size := info.Size()
	switch {
	case !info.Mode().IsRegular():
		return 0, fmt.Errorf("virtio-blk: image %s is not a regular file (%s)", file.Name(), info.Mode().Type())
	case size <= 0:
		return 0, fmt.Errorf("virtio-blk: image %s is empty", file.Name())
	case size%SectorSize != 0:
		return 0, fmt.Errorf("virtio-blk: image %s is %d bytes, not a multiple of the %d-byte sector", file.Name(), size, SectorSize)
	}
	return uint64(size) / SectorSize, nil
}

// checkWritable refuses a file opened read-only for a writable disk, so
// the mistake shows now rather than as the guest's first failed write.
func checkWritable(raw syscall.RawConn, name string) error {
	var flags int
	var ferr error
	if err := raw.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil {
		return fmt.Errorf("virtio-blk: image %s: %w", name, err)
	}
	if ferr != nil {
		return fmt.Errorf("virtio-blk: image %s: reading its open flags: %w", name, ferr)
	}
	if flags&unix.O_ACCMODE == unix.O_RDONLY {
		return fmt.Errorf("virtio-blk: image %s is open read-only but Options.ReadOnly is not set", name)
	}
	return nil
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
// between the file and guest buffers in place.
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
// then, and the image may have grown since (the capacity is the file's
// size when New made the device).
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
