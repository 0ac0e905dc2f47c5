package vsock

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// The device across a VM snapshot (virtio.StateSaver). Its connections
// do not survive one: their host ends belong to the process that took
// it. A restored guest's kernel still holds its end of each, so a device
// restored from a snapshot taken with connections open sends
// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (virtio 1.2 §5.10.6.7, as
// Firecracker does after a restore) into the guest's first event buffer:
// Linux resets every connected socket and reads the guest CID again;
// listening sockets stay. A snapshot taken with none open (the warm-start
// snapshot point) sends nothing: Linux handles the event beside its rx
// work, so a connection the host dials at once after the restore could
// be reset with it.

var _ virtio.StateSaver = (*Device)(nil)

// stateVersion is the version of the saved state; another is refused.
const stateVersion = 1

// savedDevice is the state SaveDeviceState encodes (JSON).
type savedDevice struct {
	Version int
	// ResetGuest says connections were open: the restored device resets
	// the guest's.
	ResetGuest bool
}

// eventTransportReset is VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, the id of a
// struct virtio_vsock_event (le32).
const eventTransportReset = 0

// SaveDeviceState implements virtio.StateSaver.
func (d *Device) SaveDeviceState() ([]byte, error) {
	d.m.mu.Lock()
	open := len(d.m.conns)
	d.m.mu.Unlock()
	return json.Marshal(savedDevice{Version: stateVersion, ResetGuest: open > 0})
}

// RestoreDeviceState implements virtio.StateSaver: the next activation
// resets the guest's connections if the snapshot had any.
func (d *Device) RestoreDeviceState(state []byte) error {
	var saved savedDevice
	dec := json.NewDecoder(bytes.NewReader(state))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&saved); err != nil {
		return fmt.Errorf("vsock: the saved state does not parse: %w", err)
	}
	if saved.Version != stateVersion {
		return fmt.Errorf("vsock: a saved state of version %d, this device reads %d", saved.Version, stateVersion)
	}
	d.life.Lock()
	defer d.life.Unlock()
	if d.stop != nil {
		return errors.New("vsock: RestoreDeviceState needs a device never activated")
	}
	d.resetGuest = saved.ResetGuest
	return nil
}

// sendTransportReset writes the event into the guest's next event buffer
// and says whether it is still pending (the guest posted none yet: its
// Notify wakes the worker again). A buffer too small for the event is
// given back empty and the next one tried, at most a queue's worth; the
// only error is a broken queue.
func (w *worker) sendTransportReset() (pending bool, err error) {
	var ev [4]byte // struct virtio_vsock_event
	binary.LittleEndian.PutUint32(ev[:], eventTransportReset)
	for range queueSize {
		chain, err := w.event.Pop()
		var chainErr *virtio.ChainError
		switch {
		case errors.As(err, &chainErr):
			w.d.log.Warn("vsock: guest event chain refused", "err", err)
			continue
		case err != nil:
			return false, fmt.Errorf("vsock: event queue: %w", err)
		case chain == nil:
			return true, nil
		}
		n, _ := chain.Writer().Write(ev[:])
		if err := w.event.Complete(chain, uint32(n), w.irq); err != nil {
			return false, fmt.Errorf("vsock: event queue: %w", err)
		}
		if n == len(ev) {
			w.d.cfg.Logger.Info("vsock: the guest's connections reset after a restore")
			return false, nil
		}
		w.d.log.Warn("vsock: guest event buffer too small", "bytes", n)
	}
	return false, nil
}
