package kvm

// A vCPU's counters: KVM's binary statistics (KVM_GET_STATS_FD, Linux
// 5.14), the exits and injections KVM counted for the vCPU, which no exit
// reaching userspace shows (timer interrupts, interrupt windows, nested
// page faults, emulated instructions). Read when a VM ends, they say what
// a guest cost its host; under nested virtualisation each of those exits
// is dear.
//
// The file: a header (kvm_stats_header), num_desc descriptors of
// statsDescSize+name_size bytes each (kvm_stats_desc, its NUL-padded name
// last) and the data, size u64 values per counter at data_offset plus the
// descriptor's offset.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

const (
	// ioctlGetStatsFD is KVM_GET_STATS_FD, _IO(KVMIO, 0xce).
	ioctlGetStatsFD = 0xaece
	// statsHeaderSize and statsDescSize are the sizes of kvm_stats_header
	// and of kvm_stats_desc before its name.
	statsHeaderSize = 24
	statsDescSize   = 16
	// maxStatsNameSize, maxStatsDescs and maxStatsDataBytes bound what
	// readStats accepts (KVM's names take 48 bytes, a vCPU has ~40
	// counters, a few histograms of 32 buckets among them).
	maxStatsNameSize  = 256
	maxStatsDescs     = 1024
	maxStatsDataBytes = 1 << 20
)

// ErrBadStats is the error of stats readStats cannot make sense of.
var ErrBadStats = errors.New("kvm: malformed binary statistics")

// Counters returns the vCPU's single-valued statistics by name (exits,
// irq_injections, pf_taken, …; histograms are left out).
func (c *VCPU) Counters() (map[string]uint64, error) {
	s, err := c.OpenStats()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Counters()
}

// Stats is a vCPU's open statistics file. Opening it is a vCPU ioctl,
// which waits for a running KVM_RUN to return (KVM holds the vCPU's mutex
// across it, and a guest spinning without I/O may not return for long);
// reading it takes no such lock, so an open Stats reads a running vCPU's
// counters at once.
type Stats struct {
	id int
	f  *os.File
}

// OpenStats opens the vCPU's statistics (KVM_GET_STATS_FD).
func (c *VCPU) OpenStats() (*Stats, error) {
	fd, err := ioctlValue(c.fd, ioctlGetStatsFD, 0)
	if err != nil {
		return nil, fmt.Errorf("KVM_GET_STATS_FD vCPU %d: %w", c.id, err)
	}
	return &Stats{id: c.id, f: os.NewFile(fd, "kvm-vcpu-stats")}, nil
}

// Counters reads the single-valued statistics by name, as they are now.
func (s *Stats) Counters() (map[string]uint64, error) {
	counters, err := readStats(s.f)
	if err != nil {
		return nil, fmt.Errorf("vCPU %d: %w", s.id, err)
	}
	return counters, nil
}

// Close closes the statistics file.
func (s *Stats) Close() error { return s.f.Close() }

// statsDesc is one descriptor's part readStats uses.
type statsDesc struct {
	name   string
	size   uint16 // values (1 for a counter)
	offset uint32 // from the data's start
}

// readStats reads the single-valued statistics of a binary stats file.
func readStats(r io.ReaderAt) (map[string]uint64, error) {
	le := binary.LittleEndian
	hdr := make([]byte, statsHeaderSize)
	if _, err := r.ReadAt(hdr, 0); err != nil {
		return nil, fmt.Errorf("%w: header: %w", ErrBadStats, err)
	}
	nameSize, numDesc := le.Uint32(hdr[4:]), le.Uint32(hdr[8:])
	descOffset, dataOffset := le.Uint32(hdr[16:]), le.Uint32(hdr[20:])
	if nameSize == 0 || nameSize > maxStatsNameSize || numDesc > maxStatsDescs {
		return nil, fmt.Errorf("%w: %d descriptors with %d-byte names", ErrBadStats, numDesc, nameSize)
	}
	descs, dataBytes, err := readStatsDescs(r, int64(descOffset), int(numDesc), int(nameSize))
	if err != nil {
		return nil, err
	}
	data := make([]byte, dataBytes)
	if _, err := r.ReadAt(data, int64(dataOffset)); err != nil {
		return nil, fmt.Errorf("%w: %d bytes of data at %d: %w", ErrBadStats, dataBytes, dataOffset, err)
	}
	counters := make(map[string]uint64, len(descs))
	for _, d := range descs {
		if d.size == 1 {
			counters[d.name] = le.Uint64(data[d.offset:])
		}
	}
	return counters, nil
}

// readStatsDescs reads numDesc descriptors at offset and returns them with
// how many bytes of data they reach.
func readStatsDescs(r io.ReaderAt, offset int64, numDesc, nameSize int) ([]statsDesc, int, error) {
	le := binary.LittleEndian
	descSize := statsDescSize + nameSize
	raw := make([]byte, descSize*numDesc)
	if _, err := r.ReadAt(raw, offset); err != nil {
		return nil, 0, fmt.Errorf("%w: %d descriptors at %d: %w", ErrBadStats, numDesc, offset, err)
	}
	descs := make([]statsDesc, 0, numDesc)
	dataBytes := 0
	for i := 0; i < numDesc; i++ {
		b := raw[i*descSize : (i+1)*descSize]
		d := statsDesc{size: le.Uint16(b[6:]), offset: le.Uint32(b[8:])}
		name := b[statsDescSize:]
		end := 0
		for end < len(name) && name[end] != 0 {
			end++
		}
		if end == 0 || end == len(name) {
			return nil, 0, fmt.Errorf("%w: descriptor %d has no NUL-terminated name", ErrBadStats, i)
		}
		d.name = string(name[:end])
		reach := int(d.offset) + 8*int(d.size)
		if d.size == 0 || reach > maxStatsDataBytes {
			return nil, 0, fmt.Errorf("%w: %s: %d values at data offset %d", ErrBadStats, d.name, d.size, d.offset)
		}
		dataBytes = max(dataBytes, reach)
		descs = append(descs, d)
	}
	return descs, dataBytes, nil
}
