package rng

import (
	"crypto/rand"
	"errors"
	"io"
	"log/slog"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// MaxBytesPerRequest caps the entropy returned for one chain, so a huge
// buffer costs the host no more than this.
const MaxBytesPerRequest = 64 << 10

// QueueSize is the size of the request queue offered to the driver.
const QueueSize = 256

// Device is a virtio-rng device. Create it with New; it implements
// virtio.Device.
type Device struct {
	log    *ratelog.Logger // guest errors, rate-limited
	source io.Reader
	worker virtio.Worker
}

// New returns an inactive device that logs guest errors to logger (nil:
// slog.Default()).
func New(logger *slog.Logger) *Device {
	if logger == nil {
		logger = slog.Default()
	}
	return &Device{log: ratelog.New(logger.With("device", "virtio-rng"), nil), source: rand.Reader}
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceTypeRNG }

// Features implements virtio.Device: virtio-rng has no feature bits.
func (d *Device) Features() uint64 { return 0 }

// QueueMaxSizes implements virtio.Device: one request queue.
func (d *Device) QueueMaxSizes() []uint16 { return []uint16{QueueSize} }

// ReadConfig implements virtio.Device: there is no configuration space.
func (d *Device) ReadConfig(offset uint64, data []byte) {}

// WriteConfig implements virtio.Device: there is no configuration space.
func (d *Device) WriteConfig(offset uint64, data []byte) {}

// Activate implements virtio.Device: it starts the worker serving queue 0.
func (d *Device) Activate(mem virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, features uint64) error {
	if len(queues) != 1 || queues[0] == nil {
		return errors.New("virtio-rng: the driver did not enable the request queue")
	}
	return d.worker.Start(func(wake, stop <-chan struct{}) { d.serve(queues[0], irq, wake, stop) })
}

// Notify implements virtio.Device: it wakes the worker.
func (d *Device) Notify(queue int) { d.worker.Wake() }

// Reset implements virtio.Device: it stops the worker and waits for it.
func (d *Device) Reset() { d.worker.Stop() }

func (d *Device) serve(q *virtio.Queue, irq virtio.Interrupt, wake, stop <-chan struct{}) {
	buf := make([]byte, 4096)
	for {
		if !d.drain(q, irq, buf) {
			return // queue broken; wait for the reset
		}
		select {
		case <-wake:
		case <-stop:
			return
		}
	}
}

// drain serves every available chain; it reports false once the queue is
// broken.
func (d *Device) drain(q *virtio.Queue, irq virtio.Interrupt, buf []byte) bool {
	defer func() {
		if q.NeedsInterrupt() {
			irq.SignalUsed()
		}
	}()
	for {
		chain, err := q.Pop()
		var chainErr *virtio.ChainError
		switch {
		case errors.As(err, &chainErr):
			d.log.Warn("virtio-rng: refused a request", "err", err)
			continue
		case err != nil:
			irq.NeedsReset(err)
			return false
		case chain == nil:
			return true
		}
		if err := q.Push(chain, d.fill(chain.Writer(), buf)); err != nil {
			irq.NeedsReset(err)
			return false
		}
	}
}

// fill writes up to MaxBytesPerRequest random bytes and returns how many
// reached the guest.
func (d *Device) fill(w *virtio.ChainWriter, buf []byte) uint32 {
	want := min(w.Available(), MaxBytesPerRequest)
	for want > 0 {
		chunk := buf[:min(want, uint32(len(buf)))]
		if _, err := io.ReadFull(d.source, chunk); err != nil {
			d.log.Warn("virtio-rng: reading host entropy failed", "err", err)
			break
		}
		if _, err := w.Write(chunk); err != nil {
			d.log.Warn("virtio-rng: writing entropy to the guest failed", "err", err)
			break
		}
		want -= uint32(len(chunk))
	}
	return w.Written()
}
