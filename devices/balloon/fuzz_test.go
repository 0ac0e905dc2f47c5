package balloon

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// fuzzMemSize is the guest memory of each fuzz run: small, so a run is
// cheap, and page numbers both in and out of it are easy to hit.
const fuzzMemSize = 1 << 20

// fuzzReportDescSize is one report range in FuzzBalloon's input: le64
// address, le32 length, a flags byte (bit 0: device-writable; bit 7: the
// address as is, else modulo twice the memory size).
const fuzzReportDescSize = 13

// FuzzBalloon input: byte 0 picks the queue (mod 4: inflate, deflate,
// statistics, reporting); for the first three the rest is the contents of
// one readable chain, for reporting it is a list of ranges (see
// fuzzReportDescSize). Whatever it holds, the device must return the
// chain (statistics: on request), discard only page-aligned ranges inside
// guest RAM, keep its count within RAM, and keep serving.
func FuzzBalloon(f *testing.F) {
	f.Add(append([]byte{0}, pfnBytes(10, 11, 12, 200, 0xffffffff)...))
	f.Add(append([]byte{1}, pfnBytes(10, 1<<20)...))
	f.Add(append([]byte{2}, statsBytes([2]uint64{4, 1 << 30}, [2]uint64{0xffff, 1})...))
	f.Add([]byte{3, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 1, 1, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 64<<10 {
			return
		}
		r := newRig(t, rigOptions{keep: true, memSize: fuzzMemSize})
		switch data[0] % 4 {
		case 0:
			r.send(t, qInflate, data[1:])
		case 1:
			r.send(t, qDeflate, data[1:])
		case 2:
			fuzzStats(t, r, data[1:])
		case 3:
			fuzzReport(t, r, data[1:])
		}
		for _, call := range r.mem.discards() {
			require.Zero(t, call.gpa%virtio.PageSize, "unaligned discard %+v", call)
			require.Zero(t, call.length%virtio.PageSize, "unaligned discard %+v", call)
			require.LessOrEqual(t, call.length, uint64(fuzzMemSize))
			require.LessOrEqual(t, call.gpa, uint64(fuzzMemSize)-call.length, "discard %+v outside RAM", call)
		}
		require.LessOrEqual(t, r.dev.Counters().BalloonPages, uint64(fuzzMemSize/virtio.PageSize))
		r.stillWorks(t)
	})
}

func fuzzStats(t *testing.T, r *rig, contents []byte) {
	q := r.d.Queue(qStats)
	head, err := q.Add(virtiotest.Readable(contents))
	require.NoError(t, err)
	q.Kick()
	eventually(t, "statistics", func() bool { return r.dev.Stats().Updates == 1 })
	require.True(t, r.dev.RequestStats())
	used, err := q.Wait(testTimeout)
	require.NoError(t, err)
	require.Equal(t, head, used.Head)
}

func fuzzReport(t *testing.T, r *rig, contents []byte) {
	var descs []virtiotest.Descriptor
	for len(contents) >= fuzzReportDescSize && len(descs) < 64 {
		d := virtiotest.Descriptor{
			Addr: binary.LittleEndian.Uint64(contents),
			Len:  binary.LittleEndian.Uint32(contents[8:]),
		}
		flags := contents[12]
		if flags&0x80 == 0 {
			d.Addr %= 2 * fuzzMemSize
			d.Len %= 2 * fuzzMemSize
		}
		if flags&1 != 0 {
			d.Flags = virtio.DescFlagWrite
		}
		descs = append(descs, d)
		contents = contents[fuzzReportDescSize:]
	}
	if len(descs) == 0 {
		return
	}
	r.sendRaw(t, qReporting, descs...)
}
