package vmm

import (
	"bytes"
	"encoding/gob"
	"errors"
	"fmt"
	"io"

	"github.com/cowork-vmm/cowork-vmm/vmm/snapshot"
)

// Sections of a snapshot this package writes and reads; callers add their
// own (devices) under other names.
const (
	SectionState  = "vm"     // State, gob-encoded
	SectionMemory = "memory" // guest RAM, regions in address order
)

// WriteSnapshot writes a paused VM (Pause) to w as a snapshot of id: its
// State, its memory, and the caller's extra sections. Devices must be
// quiet (no request in flight): a device writing guest memory meanwhile
// would tear the image. Guest RAM is written through Memory.WriteSparse:
// pages the guest never touched are skipped unread.
func (v *VM) WriteSnapshot(w io.Writer, id snapshot.Identity, extra ...snapshot.Section) error {
	if id.MemoryBytes != v.mem.Size() || id.CPUs != len(v.vcpus) {
		return fmt.Errorf("vmm: snapshot identity says %d bytes and %d vCPUs, the VM has %d and %d",
			id.MemoryBytes, id.CPUs, v.mem.Size(), len(v.vcpus))
	}
	state, err := v.SaveState()
	if err != nil {
		return err
	}
	var enc bytes.Buffer
	if err := gob.NewEncoder(&enc).Encode(state); err != nil {
		return fmt.Errorf("vmm: encoding the VM state: %w", err)
	}
	sections := append([]snapshot.Section{
		{Name: SectionState, Size: int64(enc.Len()), Data: &enc},
		{Name: SectionMemory, Size: int64(v.mem.Size()), Data: v.mem.Reader()},
	}, extra...)
	return snapshot.Write(w, id, sections)
}

// RestoreSnapshot creates a VM of cfg from f (opened with the identity of
// cfg): guest memory mapped copy-on-write from its memory section, the
// vCPUs, irqchip, PIT and clock from its state. The VM is not started:
// register its devices (restored from their sections), then Start.
func RestoreSnapshot(cfg Config, f *snapshot.File) (*VM, error) {
	if f.Identity.MemoryBytes != cfg.MemoryBytes || f.Identity.CPUs != cfg.CPUs {
		return nil, fmt.Errorf("vmm: the snapshot is of %d bytes and %d vCPUs, the VM to restore %d and %d: %w",
			f.Identity.MemoryBytes, f.Identity.CPUs, cfg.MemoryBytes, cfg.CPUs, snapshot.ErrMismatch)
	}
	state, err := readState(f)
	if err != nil {
		return nil, err
	}
	mem, offset, ok := f.Section(SectionMemory)
	if !ok || uint64(mem.Size()) != cfg.MemoryBytes {
		return nil, errors.New("vmm: the snapshot's memory section is missing or of the wrong size")
	}
	cfg.MemoryImage = &MemoryImage{FD: int(f.Fd()), Offset: offset}
	v, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := v.RestoreState(state); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

// readState decodes the snapshot's State section.
func readState(f *snapshot.File) (*State, error) {
	r, _, ok := f.Section(SectionState)
	if !ok {
		return nil, errors.New("vmm: the snapshot has no VM state section")
	}
	var s State
	if err := gob.NewDecoder(r).Decode(&s); err != nil {
		return nil, fmt.Errorf("vmm: decoding the snapshot's VM state: %w", err)
	}
	return &s, nil
}
