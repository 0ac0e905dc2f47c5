package cow

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
)

// errCrashed is what crashStore answers once the host has "crashed".
var errCrashed = errors.New("host crashed")

// crashStore plays a host page cache over the overlay file: what the Disk
// writes, punches or zeroes stays pending in memory (reads see it) and
// reaches the real file only at Flush, which is then durable. After
// budget mutating calls the host crashes: that call and every later one
// fail, and crash then lets any subset of the pending sectors reach the
// file, as a power cut may, before the Disk is reopened.
type crashStore struct {
	real    blk.Backing
	pending []pendingWrite
	budget  int // mutating calls left before the crash; -1: none planned
	flushes int // Flush calls left before the crash; -1: none planned
	crashed bool
}

type pendingWrite struct {
	off  int64
	data []byte // zeros for a punch or a zero range
}

func (s *crashStore) Name() string { return s.real.Name() }
func (s *crashStore) Size() int64  { return s.real.Size() }

// tick counts a mutating call and reports the crash.
func (s *crashStore) tick() error {
	if s.crashed || s.budget == 0 {
		s.crashed = true
		return errCrashed
	}
	if s.budget > 0 {
		s.budget--
	}
	return nil
}

func (s *crashStore) ReadV(iov [][]byte, off int64) (int, error) {
	buf := make([]byte, iovLen(iov))
	if _, err := s.real.ReadV([][]byte{buf}, off); err != nil {
		return 0, err
	}
	for _, p := range s.pending {
		lo, hi := max(p.off, off), min(p.off+int64(len(p.data)), off+int64(len(buf)))
		if lo < hi {
			copy(buf[lo-off:hi-off], p.data[lo-p.off:])
		}
	}
	for _, b := range iov {
		buf = buf[copy(b, buf):]
	}
	return int(off), nil
}

func (s *crashStore) WriteV(iov [][]byte, off int64) error {
	if err := s.tick(); err != nil {
		return err
	}
	var data []byte
	for _, b := range iov {
		data = append(data, b...)
	}
	s.pending = append(s.pending, pendingWrite{off, data})
	return nil
}

func (s *crashStore) zero(off, size int64) error {
	if err := s.tick(); err != nil {
		return err
	}
	s.pending = append(s.pending, pendingWrite{off, make([]byte, size)})
	return nil
}

func (s *crashStore) Discard(off, size int64) error             { return s.zero(off, size) }
func (s *crashStore) WriteZeroes(off, size int64, _ bool) error { return s.zero(off, size) }

func (s *crashStore) Flush() error {
	if s.flushes == 0 {
		s.crashed = true
	}
	s.flushes--
	if err := s.tick(); err != nil {
		return err
	}
	for _, p := range s.pending {
		if err := s.real.WriteV([][]byte{p.data}, p.off); err != nil {
			return err
		}
	}
	s.pending = nil
	return nil // reaching the file is durability here: no need to sync it
}

// crash lets each pending sector reach the file with the probability
// keep gives for its offset, in the order written, and drops the rest.
func (s *crashStore) crash(rng *rand.Rand, keep func(off int64) float64) error {
	s.crashed = true
	for _, p := range s.pending {
		for at := 0; at < len(p.data); at += blk.SectorSize {
			if rng.Float64() < keep(p.off+int64(at)) {
				if err := s.real.WriteV([][]byte{p.data[at : at+blk.SectorSize]}, p.off+int64(at)); err != nil {
					return err
				}
			}
		}
	}
	s.pending = nil
	return nil
}

// sectorModel is what each sector of the disk may read as after a crash:
// its bytes at the last completed flush, or any the guest gave it since.
type sectorModel struct {
	flushed [][]byte   // per sector
	since   [][][]byte // per sector
}

func newSectorModel(base []byte) *sectorModel {
	n := len(base) / blk.SectorSize
	m := &sectorModel{flushed: make([][]byte, n), since: make([][][]byte, n)}
	for i := range n {
		m.flushed[i] = base[i*blk.SectorSize : (i+1)*blk.SectorSize]
	}
	return m
}

// wrote records data (the guest's bytes, or zeros) at off.
func (m *sectorModel) wrote(off int64, data []byte) {
	for at := 0; at < len(data); at += blk.SectorSize {
		s := (off + int64(at)) / blk.SectorSize
		m.since[s] = append(m.since[s], data[at:at+blk.SectorSize])
	}
}

// flushed records a completed flush of the disk now reading as content.
func (m *sectorModel) completedFlush(content []byte) {
	for i := range m.flushed {
		m.flushed[i] = content[i*blk.SectorSize : (i+1)*blk.SectorSize]
		m.since[i] = nil
	}
}

// check returns the first sector of got that is not allowed, described.
func (m *sectorModel) check(got, base []byte) error {
	for i := range m.flushed {
		sec := got[i*blk.SectorSize : (i+1)*blk.SectorSize]
		if bytes.Equal(sec, m.flushed[i]) {
			continue
		}
		ok := false
		for _, v := range m.since[i] {
			ok = ok || bytes.Equal(sec, v)
		}
		if !ok {
			what := "garbage"
			switch {
			case bytes.Equal(sec, base[i*blk.SectorSize:(i+1)*blk.SectorSize]):
				what = "the base's bytes"
			case allZero(sec):
				what = "zeros"
			}
			return fmt.Errorf("sector %d (cluster %d) reads %s: neither its flushed bytes nor any written since", i, int64(i)*blk.SectorSize/ClusterSize, what)
		}
	}
	return nil
}

// crashSession drives a Disk over a crashStore with random writes,
// write-zeroes, discards and flushes until the planned crash (or the end),
// crashes, and returns the model of what may be read after.
func crashSession(t *testing.T, fx *fixture, rng *rand.Rand, ops int) *sectorModel {
	t.Helper()
	d := fx.open()
	// The crash comes at a random call, or (as often) at a random Flush,
	// where the most is pending: inside a commit.
	store := &crashStore{real: d.overlay, budget: rng.IntN(4 * ops), flushes: -1}
	if rng.IntN(2) == 0 {
		store.budget, store.flushes = -1, rng.IntN(ops/3)
	}
	d.overlay = store
	m := newSectorModel(fx.baseBytes())
	for i := 0; i < ops && !store.crashed; i++ {
		off := rng.Int64N(fx.length/512) * 512
		n := min(rng.Int64N(2*ClusterSize/512+1)*512+512, fx.length-off)
		var err error
		switch k := rng.IntN(10); {
		case k == 0:
			err = d.WriteZeroes(off, n, rng.IntN(2) == 0)
			m.wrote(off, make([]byte, n))
		case k == 1:
			err = d.Discard(off, n)
			m.wrote(off, make([]byte, n)) // discarded: zeros, or as before
		case k <= 3:
			content := readAt(t, d, 0, int(fx.length))
			if err = d.Flush(); err == nil {
				m.completedFlush(content)
			}
		default:
			data := pattern(int(n), byte(rng.Uint32()))
			err = d.WriteV(split(data, 4096), off)
			m.wrote(off, data)
		}
		if err != nil {
			require.ErrorIs(t, err, errCrashed)
		}
	}
	require.NoError(t, store.crash(rng, crashKeeps(d.l, rng.IntN(5))))
	return m
}

// crashKeeps returns which pending sectors a crash keeps: none, half, all,
// or the adversaries: all of the map slots and none of the data, or the
// reverse.
func crashKeeps(l layout, mode int) func(off int64) float64 {
	return func(off int64) float64 {
		meta := off < l.dataOffset
		switch mode {
		case 0:
			return 0
		case 1:
			return 0.5
		case 2:
			return 1
		case 3:
			return map[bool]float64{true: 1, false: 0}[meta]
		}
		return map[bool]float64{true: 0, false: 1}[meta]
	}
}

// After a crash at any point, of any of the writes not yet synced, the
// reopened overlay reads each sector as of the last completed flush or as
// written since, never garbage nor bytes it was not given.
func TestCrashLeavesAFlushedOrLaterState(t *testing.T) {
	for seed := range uint64(64) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			fx := newSizedFixture(t, testBaseOffset+16*ClusterSize+1024, 16*ClusterSize+1024) // small: the model is per sector
			rng := rand.New(rand.NewPCG(seed, 41))
			m := crashSession(t, fx, rng, 40)
			d, err := fx.tryOpen(testIdentity, fx.length)
			require.NoError(t, err, "reopening after the crash")
			require.NoError(t, m.check(readAt(t, d, 0, int(fx.length)), fx.baseBytes()))
		})
	}
}

// A map of many sectors (a 64 MiB base: 1024 clusters, a 256-byte
// bitmap) torn by a crash in the middle of its write: the slot is refused
// by its checksum and the previous generation, in the other slot, is
// served whole.
func TestTornMapKeepsThePreviousGeneration(t *testing.T) {
	const length = 64 << 20
	fx := newSizedFixture(t, 1<<20, 0)
	fx.length = length
	require.NoError(t, os.Truncate(fx.imagePath, testBaseOffset+length)) // sparse: the base reads zeros past 1 MiB
	d := fx.open()
	require.Greater(t, d.l.bitmapBytes+headerSize, int64(blk.SectorSize), "the map must span sectors")
	store := &crashStore{real: d.overlay, budget: -1, flushes: -1}
	d.overlay = store
	first, second := pattern(ClusterSize, 1), pattern(ClusterSize, 2)
	require.NoError(t, d.WriteV([][]byte{first}, 1000*ClusterSize))
	require.NoError(t, d.Flush())
	require.EqualValues(t, 2, d.Generation())

	require.NoError(t, d.WriteV([][]byte{second}, 1010*ClusterSize))
	store.flushes = 1 // the data's sync completes, the map's does not
	require.ErrorIs(t, d.Flush(), errCrashed)
	slot3 := d.l.slotOffset(3)
	require.NoError(t, store.crash(rand.New(rand.NewPCG(1, 1)), func(off int64) float64 {
		return map[bool]float64{true: 1, false: 0}[off == slot3] // the header's sector only
	}))

	d, err := fx.tryOpen(testIdentity, length)
	require.NoError(t, err, "reopening after a torn map write")
	require.EqualValues(t, 2, d.Generation())
	require.Equal(t, first, readAt(t, d, 1000*ClusterSize, ClusterSize), "a flushed cluster was lost")
	require.Equal(t, make([]byte, ClusterSize), readAt(t, d, 1010*ClusterSize, ClusterSize))
}
