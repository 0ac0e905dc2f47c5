package virtio_test

import (
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// probeDevice is a virtio device that records what the transport does to
// it; tests pop its queues themselves.
type probeDevice struct {
	features    uint64
	maxSizes    []uint16
	activateErr error

	mu         sync.Mutex
	config     [8]byte
	queues     []*virtio.Queue
	irq        virtio.Interrupt
	negotiated uint64
	activated  int
	resets     int
	notified   []int
}

func newProbeDevice(maxSizes ...uint16) *probeDevice {
	if len(maxSizes) == 0 {
		maxSizes = []uint16{16}
	}
	return &probeDevice{features: 1 << 3, maxSizes: maxSizes, config: [8]byte{1, 2, 3, 4, 5, 6, 7, 8}}
}

func (p *probeDevice) Type() uint32            { return 0x42 }
func (p *probeDevice) Features() uint64        { return p.features }
func (p *probeDevice) QueueMaxSizes() []uint16 { return p.maxSizes }

func (p *probeDevice) ReadConfig(offset uint64, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if offset < uint64(len(p.config)) {
		copy(data, p.config[offset:])
	}
}

func (p *probeDevice) WriteConfig(offset uint64, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if offset < uint64(len(p.config)) {
		copy(p.config[offset:], data)
	}
}

func (p *probeDevice) Activate(mem virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, features uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.activateErr != nil {
		return p.activateErr
	}
	p.activated++
	p.queues, p.irq, p.negotiated = queues, irq, features
	return nil
}

func (p *probeDevice) Notify(queue int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notified = append(p.notified, queue)
}

func (p *probeDevice) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resets++
	p.queues, p.irq = nil, nil
}

func (p *probeDevice) queue(t *testing.T, i int) *virtio.Queue {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Less(t, i, len(p.queues), "device not activated")
	require.NotNil(t, p.queues[i])
	return p.queues[i]
}

func (p *probeDevice) interrupt() virtio.Interrupt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.irq
}

// setup starts a driver for a probe device with the given queue sizes.
func setup(t *testing.T, opts virtiotest.Options, maxSizes ...uint16) (*probeDevice, *virtiotest.Driver) {
	t.Helper()
	dev := newProbeDevice(maxSizes...)
	return dev, virtiotest.Start(t, dev, opts)
}

// popChainError pops and expects a refused chain, returning its error.
func popChainError(t *testing.T, q *virtio.Queue) *virtio.ChainError {
	t.Helper()
	c, err := q.Pop()
	require.Nil(t, c)
	var chainErr *virtio.ChainError
	require.True(t, errors.As(err, &chainErr), "want a ChainError, got %v", err)
	require.ErrorIs(t, err, virtio.ErrInvalidChain)
	return chainErr
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
