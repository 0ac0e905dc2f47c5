package machine

import (
	"bytes"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/serial"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// Snapshot sections the machine adds to the VM's: each virtio transport,
// by slot, and the console.
const (
	sectionVirtio = "machine/virtio/"
	sectionUART   = "machine/uart"
)

// Identity returns the snapshot identity of a machine of this shape run
// by build (the helper's version and hash) on kernel (its hash).
func (m *Machine) Identity(build, kernel string) snapshot.Identity {
	return snapshot.Identity{Build: build, Kernel: kernel, MemoryBytes: uint64(m.cfg.MemMiB) << 20, CPUs: m.cfg.CPUs}
}

// Snapshot pauses the running machine and writes it to w as a snapshot of
// id: the VM (vCPUs, irqchip, clock, memory), every virtio transport and
// the console. The devices must be quiet (no request in flight: their
// transports refuse otherwise). The machine stays paused: Resume it or
// Stop it.
func (m *Machine) Snapshot(w io.Writer, id snapshot.Identity) error {
	if err := m.vm.Pause(); err != nil {
		return err
	}
	m.mu.Lock()
	transports := m.virtio
	m.mu.Unlock()
	var extra []snapshot.Section
	for i, t := range transports {
		s, err := quietState(t)
		if err != nil {
			return fmt.Errorf("machine: virtio device %d (type %d): %w", i, t.Device().Type(), err)
		}
		sec, err := gobSection(fmt.Sprint(sectionVirtio, i), s)
		if err != nil {
			return err
		}
		extra = append(extra, sec)
	}
	sec, err := gobSection(sectionUART, m.uart.SaveState())
	if err != nil {
		return err
	}
	return m.vm.WriteSnapshot(w, id, append(extra, sec)...)
}

// quietState saves t's state once the requests its device has in flight
// are answered: devices keep running while the vCPUs are paused, so a
// request taken just before the pause (the guest's entropy refill) ends in
// a moment; one still open after quietWait fails the snapshot. A device
// that keeps a chain by design (virtio.Quiescer) is asked to give it back
// first.
func quietState(t *virtio.MMIO) (virtio.MMIOState, error) {
	if q, ok := t.Device().(virtio.Quiescer); ok {
		q.Quiesce()
	}
	deadline := time.Now().Add(quietWait)
	for {
		s, err := t.SaveState()
		if !errors.Is(err, virtio.ErrInFlight) || time.Now().After(deadline) {
			return s, err
		}
		time.Sleep(time.Millisecond)
	}
}

// quietWait bounds quietState's wait for a device's requests in flight.
const quietWait = 2 * time.Second

// Resume lets a machine paused by Snapshot go on.
func (m *Machine) Resume() { m.vm.Resume() }

// gobSection encodes v as a snapshot section.
func gobSection(name string, v any) (snapshot.Section, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(v); err != nil {
		return snapshot.Section{}, fmt.Errorf("machine: encoding %s: %w", name, err)
	}
	return snapshot.Section{Name: name, Size: int64(b.Len()), Data: &b}, nil
}

// readGob decodes section name of f into v.
func readGob(f *snapshot.File, name string, v any) error {
	r, _, ok := f.Section(name)
	if !ok {
		return fmt.Errorf("machine: the snapshot has no %s", name)
	}
	if err := gob.NewDecoder(r).Decode(v); err != nil {
		return fmt.Errorf("machine: decoding the snapshot's %s: %w", name, err)
	}
	return nil
}

// Restore builds a machine of cfg (the shape of the one snapshotted; no
// kernel is loaded) from the snapshot f, opened with that machine's
// identity: RAM mapped copy-on-write from the file, vCPUs at the snapshot
// point. Attach the same devices in the same order (AddVirtioMMIO), then
// StartRestored. f must stay open until StartRestored returns.
func Restore(cfg Config, f *snapshot.File) (*Machine, error) {
	m, err := assembleWith(cfg, func(c vmm.Config) (*vmm.VM, error) { return vmm.RestoreSnapshot(c, f) })
	if err != nil {
		return nil, err
	}
	m.restoring = f
	return m, nil
}

// StartRestored gives the attached devices' transports and the console
// their state from the snapshot and runs the vCPUs from where they were.
func (m *Machine) StartRestored() error {
	m.mu.Lock()
	f, transports := m.restoring, m.virtio
	m.restoring = nil
	m.mu.Unlock()
	if f == nil {
		return errors.New("machine: StartRestored of a machine not made by Restore")
	}
	for i, t := range transports {
		var s virtio.MMIOState
		if err := readGob(f, fmt.Sprint(sectionVirtio, i), &s); err != nil {
			return err
		}
		if err := t.RestoreState(s); err != nil {
			return fmt.Errorf("machine: virtio device %d: %w", i, err)
		}
	}
	if _, _, ok := f.Section(fmt.Sprint(sectionVirtio, len(transports))); ok {
		return fmt.Errorf("machine: the snapshot has more virtio devices than the %d attached", len(transports))
	}
	var uart serial.UARTState
	if err := readGob(f, sectionUART, &uart); err != nil {
		return err
	}
	m.uart.RestoreState(uart)
	return m.startVCPUs()
}
