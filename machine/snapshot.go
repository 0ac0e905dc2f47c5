package machine

import (
	"bytes"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/serial"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/vmm"
	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// Snapshot sections the machine adds to the VM's: each virtio transport,
// by slot, the own state of each device that keeps one
// (virtio.StateSaver), by slot, the caller's sections (Snapshot's extra),
// and the console.
const (
	sectionVirtio       = "machine/virtio/"
	sectionVirtioDevice = "machine/virtio-dev/"
	sectionUART         = "machine/uart"
)

// maxDeviceState bounds a device's own state read back from a snapshot:
// a virtio-fs session with its whole node table is a few MiB at most.
const maxDeviceState = 64 << 20

// Identity returns the snapshot identity of a machine of this shape run
// by build (the helper's version and hash) on kernel (its hash).
func (m *Machine) Identity(build, kernel string) snapshot.Identity {
	return snapshot.Identity{Build: build, Kernel: kernel, MemoryBytes: uint64(m.cfg.MemMiB) << 20, CPUs: m.cfg.CPUs}
}

// Snapshot pauses the running machine and writes it to w as a snapshot of
// id: the VM (vCPUs, irqchip, clock, memory), every virtio transport and
// the own state of each device that keeps one (virtio.StateSaver), the
// caller's extra sections (its own tables, read back from the
// snapshot.File it restores from; their names must not start with
// "machine/" nor be the VM's) and the console. The devices must be quiet (no
// request in flight: their transports refuse otherwise). The machine
// stays paused: Resume it or Stop it.
func (m *Machine) Snapshot(w io.Writer, id snapshot.Identity, extra ...snapshot.Section) error {
	if err := checkExtraSections(extra); err != nil {
		return err
	}
	if err := m.vm.Pause(); err != nil {
		return err
	}
	m.mu.Lock()
	transports := m.virtio
	m.mu.Unlock()
	sections, err := transportSections(transports)
	if err != nil {
		return err
	}
	sections = append(sections, extra...)
	sec, err := gobSection(sectionUART, m.uart.SaveState())
	if err != nil {
		return err
	}
	return m.vm.WriteSnapshot(w, id, append(sections, sec)...)
}

// checkExtraSections refuses caller sections whose names are the
// machine's or the VM's, or repeat.
func checkExtraSections(extra []snapshot.Section) error {
	seen := make(map[string]bool, len(extra))
	for _, s := range extra {
		if s.Name == "" || strings.HasPrefix(s.Name, "machine/") || seen[s.Name] ||
			s.Name == vmm.SectionState || s.Name == vmm.SectionMemory {
			return fmt.Errorf("machine: snapshot section name %q is empty, taken or repeated", s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

// transportSections saves each transport once its device is quiet
// (quietState) and, after it, the state of a device that keeps one of its
// own: the device sees its transport quiet, nothing in flight.
func transportSections(transports []*virtio.MMIO) ([]snapshot.Section, error) {
	var sections []snapshot.Section
	for i, t := range transports {
		s, err := quietState(t)
		if err != nil {
			return nil, fmt.Errorf("machine: virtio device %d (type %d): %w", i, t.Device().Type(), err)
		}
		sec, err := gobSection(fmt.Sprint(sectionVirtio, i), s)
		if err != nil {
			return nil, err
		}
		sections = append(sections, sec)
		saver, ok := t.Device().(virtio.StateSaver)
		if !ok {
			continue
		}
		state, err := saver.SaveDeviceState()
		if err != nil {
			return nil, fmt.Errorf("machine: saving virtio device %d (type %d): %w", i, t.Device().Type(), err)
		}
		sections = append(sections, snapshot.Section{
			Name: fmt.Sprint(sectionVirtioDevice, i), Size: int64(len(state)), Data: bytes.NewReader(state),
		})
	}
	return sections, nil
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

// StartRestored gives the attached devices their own state and their
// transports and the console their state from the snapshot, and runs the
// vCPUs from where they were.
func (m *Machine) StartRestored() error {
	m.mu.Lock()
	f, transports := m.restoring, m.virtio
	m.restoring = nil
	m.mu.Unlock()
	if f == nil {
		return errors.New("machine: StartRestored of a machine not made by Restore")
	}
	if err := restoreTransports(f, transports); err != nil {
		return err
	}
	var uart serial.UARTState
	if err := readGob(f, sectionUART, &uart); err != nil {
		return err
	}
	m.uart.RestoreState(uart)
	return m.startVCPUs()
}

// restoreTransports restores each transport from f, its device's own
// state first: the transport's RestoreState activates the device, which
// then goes on from that state.
func restoreTransports(f *snapshot.File, transports []*virtio.MMIO) error {
	for i, t := range transports {
		var s virtio.MMIOState
		if err := readGob(f, fmt.Sprint(sectionVirtio, i), &s); err != nil {
			return err
		}
		if err := restoreDeviceState(f, i, t.Device()); err != nil {
			return err
		}
		if err := t.RestoreState(s); err != nil {
			return fmt.Errorf("machine: virtio device %d: %w", i, err)
		}
	}
	if _, _, ok := f.Section(fmt.Sprint(sectionVirtio, len(transports))); ok {
		return fmt.Errorf("machine: the snapshot has more virtio devices than the %d attached", len(transports))
	}
	return nil
}

// restoreDeviceState gives device i its own state from f, if it keeps one
// (virtio.StateSaver). A snapshot with no state for it (taken before
// devices saved theirs) leaves the device to start afresh, as it did then.
func restoreDeviceState(f *snapshot.File, i int, dev virtio.Device) error {
	r, _, ok := f.Section(fmt.Sprint(sectionVirtioDevice, i))
	if !ok {
		return nil
	}
	saver, isSaver := dev.(virtio.StateSaver)
	if !isSaver {
		return fmt.Errorf("machine: the snapshot has a state of its own for virtio device %d (type %d), which keeps none", i, dev.Type())
	}
	if r.Size() > maxDeviceState {
		return fmt.Errorf("machine: virtio device %d's state is %d bytes, at most %d", i, r.Size(), maxDeviceState)
	}
	state := make([]byte, r.Size())
	if _, err := io.ReadFull(r, state); err != nil {
		return fmt.Errorf("machine: reading virtio device %d's state: %w", i, err)
	}
	if err := saver.RestoreDeviceState(state); err != nil {
		return fmt.Errorf("machine: restoring virtio device %d (type %d): %w", i, dev.Type(), err)
	}
	return nil
}
