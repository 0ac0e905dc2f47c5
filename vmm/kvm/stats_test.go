package kvm

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testStat is one statistic of a stats file statsFile builds.
type testStat struct {
	name   string
	values []uint64
}

// statsFile lays stats out as KVM does: header, descriptors with
// nameSize-byte names, then the data (descriptors first, data after,
// offsets counted from the data's start).
func statsFile(nameSize int, stats []testStat) []byte {
	le := binary.LittleEndian
	descOffset := statsHeaderSize + 8 // an id string between, as KVM has
	dataOffset := descOffset + len(stats)*(statsDescSize+nameSize)
	hdr := make([]byte, statsHeaderSize)
	le.PutUint32(hdr[4:], uint32(nameSize))
	le.PutUint32(hdr[8:], uint32(len(stats)))
	le.PutUint32(hdr[12:], statsHeaderSize)
	le.PutUint32(hdr[16:], uint32(descOffset))
	le.PutUint32(hdr[20:], uint32(dataOffset))
	out := append(hdr, []byte("kvm-1234")...)
	var data []byte
	for _, s := range stats {
		d := make([]byte, statsDescSize+nameSize)
		le.PutUint16(d[6:], uint16(len(s.values)))
		le.PutUint32(d[8:], uint32(len(data)))
		copy(d[statsDescSize:], s.name)
		out = append(out, d...)
		for _, v := range s.values {
			data = le.AppendUint64(data, v)
		}
	}
	return append(out, data...)
}

func TestReadStats(t *testing.T) {
	file := statsFile(48, []testStat{
		{"exits", []uint64{7877}},
		{"halt_poll_success_hist", make([]uint64, 32)}, // a histogram: left out
		{"irq_injections", []uint64{1788}},
		{"pf_taken", []uint64{46}},
	})
	got, err := readStats(bytes.NewReader(file))
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"exits": 7877, "irq_injections": 1788, "pf_taken": 46}, got)
}

func TestReadStatsRefusesMalformed(t *testing.T) {
	good := statsFile(48, []testStat{{"exits", []uint64{1}}})
	le := binary.LittleEndian
	for _, tc := range []struct {
		name  string
		spoil func(b []byte) []byte
	}{
		{"short header", func(b []byte) []byte { return b[:10] }},
		{"no names", func(b []byte) []byte { le.PutUint32(b[4:], 0); return b }},
		{"huge names", func(b []byte) []byte { le.PutUint32(b[4:], 1<<20); return b }},
		{"too many descriptors", func(b []byte) []byte { le.PutUint32(b[8:], 1<<30); return b }},
		{"descriptors past the end", func(b []byte) []byte { le.PutUint32(b[16:], 1<<31); return b }},
		{"data past the end", func(b []byte) []byte { return b[:len(b)-4] }},
		{"name without a NUL", func(b []byte) []byte {
			copy(b[statsHeaderSize+8+statsDescSize:], bytes.Repeat([]byte{'x'}, 48))
			return b
		}},
		{"value beyond the data limit", func(b []byte) []byte {
			le.PutUint32(b[statsHeaderSize+8+8:], maxStatsDataBytes)
			return b
		}},
		{"no values", func(b []byte) []byte { le.PutUint16(b[statsHeaderSize+8+6:], 0); return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.spoil(append([]byte(nil), good...))
			_, err := readStats(bytes.NewReader(b))
			assert.ErrorIs(t, err, ErrBadStats)
		})
	}
}

// FuzzReadStats: whatever the file holds, readStats returns counters or
// ErrBadStats, never a panic.
func FuzzReadStats(f *testing.F) {
	f.Add(statsFile(48, []testStat{{"exits", []uint64{1}}, {"hist", make([]uint64, 4)}}))
	f.Add(statsFile(8, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		counters, err := readStats(bytes.NewReader(b))
		if err != nil {
			assert.ErrorIs(t, err, ErrBadStats)
			assert.Nil(t, counters)
		}
	})
}
