package virtiofs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"runtime/debug"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// Queues: the high-priority queue (FORGET, INTERRUPT), then the request
// queue. One request queue is offered: Linux's driver uses only the first.
const (
	hiprioQueue   = 0
	requestQueue  = 1
	numQueues     = 2
	numRequestQue = numQueues - 1
)

// configSize is the config space: tag[36] num_request_queues[le32].
const configSize = MaxTagLen + 4

// MaxWrite is the largest READ or WRITE payload negotiated with the guest
// (FUSE_INIT's max_write, and max_pages to match).
const MaxWrite = 1 << 20

// maxMessage bounds a request's readable bytes and a reply's writable
// bytes the device accepts: the largest payload plus room for the headers
// and arguments. A chain with more readable bytes is answered with EIO;
// writable bytes beyond it are not used.
const maxMessage = MaxWrite + 4096

// Device is a virtio-fs device (virtio id 26) serving Options.Root over the
// FUSE protocol: each chain of the request queue carries one FUSE request
// (readable buffers) and receives its reply (writable buffers); go-fuse's
// protocol server parses and answers it, over a fileSystem of this
// package. It implements virtio.Device.
type Device struct {
	opts     Options
	log      *slog.Logger
	guestLog *ratelog.Logger // guest misbehaviour, rate-limited
	config   [configSize]byte

	mu      sync.Mutex
	session *session // nil while inactive
	// restored is the session RestoreDeviceState rebuilt, which the next
	// Activate goes on from; nil otherwise.
	restored *restoredSession
}

// New returns an inactive device.
func New(opts Options) (*Device, error) {
	if opts.Tag == "" || len(opts.Tag) > MaxTagLen {
		return nil, fmt.Errorf("virtio-fs: mount tag %q must be 1..%d bytes", opts.Tag, MaxTagLen)
	}
	if opts.Root == nil {
		return nil, errors.New("virtio-fs: no Root")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.NoOpen && !opts.Cached {
		return nil, errors.New("virtio-fs: NoOpen is for a Cached device (the guest keeps what it opens without asking)")
	}
	if opts.QueueSize == 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.QueueSize&(opts.QueueSize-1) != 0 || opts.QueueSize > virtio.MaxQueueSize {
		return nil, fmt.Errorf("virtio-fs: queue size %d is not a power of two ≤ %d", opts.QueueSize, virtio.MaxQueueSize)
	}
	setDefault(&opts.MaxInFlight, DefaultMaxInFlight)
	setDefault(&opts.MaxNodes, DefaultMaxNodes)
	setDefault(&opts.MaxHandles, DefaultMaxHandles)
	log := opts.Logger.With("device", "virtio-fs", "tag", opts.Tag)
	d := &Device{opts: opts, log: log, guestLog: ratelog.New(log, nil)}
	copy(d.config[:MaxTagLen], opts.Tag)
	binary.LittleEndian.PutUint32(d.config[MaxTagLen:], numRequestQue)
	return d, nil
}

func setDefault(v *int, def int) {
	if *v <= 0 {
		*v = def
	}
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceTypeFS }

// Features implements virtio.Device: none (no notification queue).
func (d *Device) Features() uint64 { return 0 }

// QueueMaxSizes implements virtio.Device.
func (d *Device) QueueMaxSizes() []uint16 { return []uint16{d.opts.QueueSize, d.opts.QueueSize} }

// ReadConfig implements virtio.Device.
func (d *Device) ReadConfig(offset uint64, data []byte) {
	if offset >= configSize {
		return
	}
	copy(data, d.config[offset:])
}

// WriteConfig implements virtio.Device: the config space is read-only.
func (d *Device) WriteConfig(uint64, []byte) {}

// Activate implements virtio.Device: a new FUSE session starts (the
// guest's FUSE_INIT comes first), over a fresh attach of the root; or,
// after RestoreDeviceState, the restored session goes on.
func (d *Device) Activate(mem virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, _ uint64) error {
	if len(queues) != numQueues || queues[hiprioQueue] == nil || queues[requestQueue] == nil {
		return errors.New("virtio-fs: the driver did not enable both the high-priority and the request queue")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.session != nil {
		return errors.New("virtio-fs: activated twice without a reset")
	}
	if r := d.restored; r != nil {
		d.restored = nil
		d.session = startSession(d, mem, irq, queues, r.fs, r.server)
		d.session.init = r.init
		return nil
	}
	fsys := newFileSystem(d.opts.Root.Root(), d.opts)
	d.session = startSession(d, mem, irq, queues, fsys, d.newServer(fsys))
	return nil
}

// newServer returns the FUSE protocol server of a session over fsys.
func (d *Device) newServer(fsys *fileSystem) *fuse.ProtocolServer {
	return fuse.NewProtocolServer(fsys, &fuse.MountOptions{
		MaxWrite:     MaxWrite,
		MaxReadAhead: MaxWrite,
		// The guest keeps a symlink's target in its page cache instead of
		// asking at every path walk through it (/lib, /bin and the
		// interpreters' links are walked by every program start): a
		// symlink's target never changes in place, and a name the host
		// points elsewhere is a new inode, looked up as any other name.
		EnableSymlinkCaching: true,
		DisableReadDirPlus:   d.opts.ListNamesOnly,
		// go-fuse logs the guest's malformed requests here.
		Logger: log.New(&guestLogWriter{d.guestLog}, "", 0),
		// A panic in a file operation is our bug, not the guest's: an
		// error with its stack, not a rate-limited warning.
		PanicHandler: func(r any) fuse.Status {
			d.log.Error("virtio-fs: a request panicked; answered EIO", "panic", r, "stack", string(debug.Stack()))
			return fuse.EIO
		},
	})
}

// Notify implements virtio.Device: it wakes the queue's worker.
func (d *Device) Notify(queue int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.session != nil {
		d.session.wake(queue)
	}
}

// Reset implements virtio.Device: the workers stop, every request in
// flight finishes (so no guest buffer is touched after Reset returns),
// and every node and open file of the session is closed (or of a session
// restored and not yet activated).
func (d *Device) Reset() {
	d.mu.Lock()
	s, r := d.session, d.restored
	d.session, d.restored = nil, nil
	d.mu.Unlock()
	if s != nil {
		s.end()
	}
	if r != nil {
		r.fs.t.closeAll() // restored, never activated
	}
}

// Close resets the device and releases every host descriptor it holds.
func (d *Device) Close() { d.Reset() }

// Counts reports how many nodes and open handles the guest holds (0, 0
// while inactive), for tests and the log.
func (d *Device) Counts() (nodes, handles int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.session == nil {
		return 0, 0
	}
	return d.session.fs.t.counts()
}

// guestLogWriter turns go-fuse's log lines into rate-limited warnings.
type guestLogWriter struct{ l *ratelog.Logger }

func (w *guestLogWriter) Write(p []byte) (int, error) {
	w.l.Warn("virtio-fs: FUSE request refused", "detail", string(p))
	return len(p), nil
}
