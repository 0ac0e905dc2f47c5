package virtio

import (
	"errors"
	"fmt"
)

// Snapshot state of a transport and its queues: what the driver wrote to
// the registers and how far the device got on each ring. Restored into a
// fresh transport of the same device over the same guest memory, the
// driver goes on as if nothing happened. A device's own state (its
// connections, its session) is the device's to save; the transport only
// re-activates it with its queues where they were.

// QueuePosition is how far the device has got on one queue: the next
// available-ring slot it takes, the next used-ring slot it fills, and the
// used index when it last decided about an interrupt.
type QueuePosition struct {
	NextAvail, NextUsed, SignalledUsed uint16
}

// ErrInFlight says a queue holds chains the device took and has not given
// back: its state is in the device's goroutines, not in the rings, so it
// cannot be saved.
var ErrInFlight = errors.New("virtio: requests in flight")

// Position returns the queue's position; ErrInFlight while a chain it gave
// out has not been pushed back (each Pop is answered by one Push).
func (q *Queue) Position() (QueuePosition, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broken != nil {
		return QueuePosition{}, q.broken
	}
	if n := q.nextAvail - q.nextUsed; n != 0 {
		return QueuePosition{}, fmt.Errorf("%w: %d chains", ErrInFlight, n)
	}
	return QueuePosition{NextAvail: q.nextAvail, NextUsed: q.nextUsed, SignalledUsed: q.signalledUsed}, nil
}

// RestoreQueue is NewQueue at position p, which must have nothing in
// flight (Position's).
func RestoreQueue(mem GuestMemory, layout QueueLayout, features uint64, p QueuePosition) (*Queue, error) {
	if p.NextAvail != p.NextUsed {
		return nil, fmt.Errorf("%w: position %+v", ErrInFlight, p)
	}
	q, err := NewQueue(mem, layout, features)
	if err != nil {
		return nil, err
	}
	q.nextAvail, q.nextUsed, q.signalledUsed = p.NextAvail, p.NextUsed, p.SignalledUsed
	return q, nil
}

// MMIOState is a transport's state at a snapshot point.
type MMIOState struct {
	DeviceType       uint32
	Status           uint32
	InterruptStatus  uint32
	ConfigGeneration uint32
	DeviceFeatSel    uint32
	DriverFeatSel    uint32
	QueueSel         uint32
	DriverFeatures   uint64
	Negotiated       uint64
	Queues           []MMIOQueueState
}

// MMIOQueueState is one queue's part of MMIOState: the layout the driver
// wrote and, once it made the queue ready, the device's position.
type MMIOQueueState struct {
	Layout   QueueLayout
	Ready    bool
	Position QueuePosition
}

// SaveState returns the transport's state; ErrInFlight while a queue
// holds requests the device has not answered (quiesce it first).
func (m *MMIO) SaveState() (MMIOState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := MMIOState{
		DeviceType: m.dev.Type(), Status: m.status.Load(), InterruptStatus: m.intStatus.Load(),
		ConfigGeneration: m.configGen.Load(), DeviceFeatSel: m.deviceFeatSel, DriverFeatSel: m.driverFeatSel,
		QueueSel: m.queueSel, DriverFeatures: m.driverFeatures, Negotiated: m.negotiated,
	}
	for i, q := range m.queues {
		qs := MMIOQueueState{Layout: q.layout, Ready: q.queue != nil}
		if q.queue != nil {
			p, err := q.queue.Position()
			if err != nil {
				return MMIOState{}, fmt.Errorf("virtio-mmio: queue %d: %w", i, err)
			}
			qs.Position = p
		}
		s.Queues = append(s.Queues, qs)
	}
	return s, nil
}

// RestoreState gives a fresh transport (never set up by a driver) the
// state s saved from one of the same device type, and activates the
// device if the driver had (DRIVER_OK).
func (m *MMIO) RestoreState(s MMIOState) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkRestorable(s); err != nil {
		return err
	}
	queues := make([]*Queue, len(s.Queues))
	for i, qs := range s.Queues {
		if !qs.Ready {
			continue
		}
		if err := qs.Layout.Validate(m.queues[i].maxSize); err != nil {
			return fmt.Errorf("virtio-mmio: restoring queue %d: %w", i, err)
		}
		q, err := RestoreQueue(m.mem, qs.Layout, s.Negotiated, qs.Position)
		if err != nil {
			return fmt.Errorf("virtio-mmio: restoring queue %d: %w", i, err)
		}
		queues[i] = q
	}
	for i, qs := range s.Queues {
		m.queues[i].layout, m.queues[i].queue = qs.Layout, queues[i]
	}
	m.deviceFeatSel, m.driverFeatSel, m.queueSel = s.DeviceFeatSel, s.DriverFeatSel, s.QueueSel
	m.driverFeatures, m.negotiated = s.DriverFeatures, s.Negotiated
	m.intStatus.Store(s.InterruptStatus)
	m.configGen.Store(s.ConfigGeneration)
	m.status.Store(s.Status)
	if s.Status&StatusDriverOK != 0 && s.Status&StatusDeviceNeedsReset == 0 {
		m.activateLocked()
	}
	return nil
}

// checkRestorable refuses a state that does not fit this transport.
func (m *MMIO) checkRestorable(s MMIOState) error {
	switch {
	case m.status.Load() != 0 || m.active != nil:
		return errors.New("virtio-mmio: RestoreState needs a transport the driver never set up")
	case s.DeviceType != m.dev.Type():
		return fmt.Errorf("virtio-mmio: state of device type %d, this device is type %d", s.DeviceType, m.dev.Type())
	case len(s.Queues) != len(m.queues):
		return fmt.Errorf("virtio-mmio: state of %d queues, this device has %d", len(s.Queues), len(m.queues))
	case s.Negotiated&^m.offered != 0 || s.DriverFeatures&^m.offered != 0:
		return fmt.Errorf("virtio-mmio: state negotiated features %#x this transport does not offer (%#x)", s.Negotiated, m.offered)
	}
	return nil
}
