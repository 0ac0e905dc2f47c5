package balloon

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

// stillWorks checks that a good inflate chain is still served.
func (r *rig) stillWorks(t *testing.T) {
	t.Helper()
	before := r.dev.Counters().InflatedPages
	r.send(t, qInflate, pfnBytes(uint32(r.d.Mem.Size()/virtio.PageSize-1)))
	require.Equal(t, before+1, r.dev.Counters().InflatedPages)
}

func TestPagesOutsideRAMAreRefused(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	r := newRig(t, rigOptions{opts: Options{Logger: logs.Logger()}})
	r.poisonPages(t, 3000, 2)
	outside := uint32(testMemSize / virtio.PageSize) // the first page past RAM
	r.send(t, qInflate, pfnBytes(3000, outside, 0xffffffff, 3001))
	require.Equal(t, []discardCall{{3000 * virtio.PageSize, 2 * virtio.PageSize}},
		r.mem.discards(), "the refused pages in between do not split the run")
	c := r.dev.Counters()
	require.EqualValues(t, 2, c.InflatedPages)
	require.EqualValues(t, 2, c.Refused)
	require.Len(t, logs.Lines("page number outside guest RAM refused"), 2, logs.String())

	r.send(t, qDeflate, pfnBytes(outside))
	require.EqualValues(t, 2, r.dev.Counters().BalloonPages)
	r.stillWorks(t)
}

func TestHugeInflateChainIsBounded(t *testing.T) {
	r := newRig(t, rigOptions{keep: true})
	pfns := make([]uint32, MaxPagesPerChain+904)
	for i := range pfns {
		pfns[i] = 3000 // the same page over and over: no coalescing
	}
	r.send(t, qInflate, append(pfnBytes(pfns...), 1, 2)) // and a partial one
	c := r.dev.Counters()
	require.EqualValues(t, MaxPagesPerChain, c.InflatedPages)
	require.EqualValues(t, 905, c.Refused)
	require.Len(t, r.mem.discards(), MaxPagesPerChain)
	require.EqualValues(t, MaxPagesPerChain, c.BalloonPages)

	// Inflating the same pages again does not count past the RAM size.
	r.send(t, qInflate, pfnBytes(pfns[:MaxPagesPerChain]...))
	require.EqualValues(t, testMemSize/virtio.PageSize, r.dev.Counters().BalloonPages)
	r.stillWorks(t)
}

func TestHostileReportsAreRefused(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	r := newRig(t, rigOptions{opts: Options{Logger: logs.Logger()}})
	r.poisonPages(t, 3000, 10)
	base := uint64(3000 * virtio.PageSize)
	r.sendRaw(t, qReporting,
		virtiotest.Descriptor{Addr: base + 1, Len: virtio.PageSize, Flags: virtio.DescFlagWrite},     // unaligned address
		virtiotest.Descriptor{Addr: base + 2*virtio.PageSize, Len: 100, Flags: virtio.DescFlagWrite}, // unaligned length
		writable(3004, 1), // fine
	)
	require.Equal(t, "poison", r.page(t, 3000))
	require.Equal(t, "poison", r.page(t, 3001))
	require.Equal(t, "poison", r.page(t, 3002))
	require.Equal(t, "zero", r.page(t, 3004))
	require.Len(t, logs.Lines("unaligned free page report range refused"), 2, logs.String())

	// A device-readable range is not the device's to discard.
	r.sendRaw(t, qReporting, virtiotest.Descriptor{Addr: base + 5*virtio.PageSize, Len: virtio.PageSize})
	require.Equal(t, "poison", r.page(t, 3005))

	// A range past the end of RAM: the queue refuses the whole chain.
	r.sendRaw(t, qReporting, writable(3006, 1), writable(testMemSize/virtio.PageSize-1, 2))
	require.Equal(t, "poison", r.page(t, 3006))

	c := r.dev.Counters()
	require.EqualValues(t, virtio.PageSize, c.ReportedBytes)
	require.EqualValues(t, 3, c.Refused)
	r.stillWorks(t)
}

func TestReportsAreBoundedByCountAndRAM(t *testing.T) {
	// RAM of 64 KiB by the device's reckoning (the test memory is bigger).
	r := newRig(t, rigOptions{keep: true, opts: Options{RAMBytes: 16 * virtio.PageSize}})
	r.sendRaw(t, qReporting, writable(3000, 8), writable(3100, 8), writable(3200, 1))
	require.Equal(t, []discardCall{{3000 * virtio.PageSize, 8 * virtio.PageSize}, {3100 * virtio.PageSize, 8 * virtio.PageSize}},
		r.mem.discards(), "the third range would pass the RAM size")

	// More ranges than MaxReportRanges, through an indirect table.
	table := make([]virtiotest.Descriptor, MaxReportRanges+44)
	for i := range table {
		table[i] = writable(3000, 1)
		if i+1 < len(table) {
			table[i].Flags |= virtio.DescFlagNext
			table[i].Next = uint16(i + 1)
		}
	}
	q := r.d.Queue(qReporting)
	addr, err := r.d.Alloc(uint64(virtio.DescriptorSize*len(table)), 16)
	require.NoError(t, err)
	require.NoError(t, q.WriteTable(addr, table))
	r.sendRaw(t, qReporting, virtiotest.Descriptor{Addr: addr, Len: uint32(virtio.DescriptorSize * len(table)), Flags: virtio.DescFlagIndirect})
	c := r.dev.Counters()
	require.EqualValues(t, 16*virtio.PageSize+16*virtio.PageSize, c.ReportedBytes, "16 pages of RAM a report")
	require.EqualValues(t, 1+(MaxReportRanges-16)+44, c.Refused)
}

func TestBalloonCountNeverExceedsRAM(t *testing.T) {
	r := newRig(t, rigOptions{keep: true, opts: Options{RAMBytes: 16 * virtio.PageSize}})
	pfns := make([]uint32, 20)
	for i := range pfns {
		pfns[i] = uint32(3000 + i)
	}
	r.send(t, qInflate, pfnBytes(pfns...))
	require.EqualValues(t, 16, r.dev.Counters().BalloonPages)
	r.dev.SetTarget(1000)
	require.EqualValues(t, 16, r.dev.Target())
}

func TestBrokenQueueNeedsResetAndResetRecovers(t *testing.T) {
	r := newRig(t, rigOptions{})
	stats := r.d.Queue(qStats)
	_, err := stats.Add(virtiotest.Readable(statsBytes([2]uint64{4, 1})))
	require.NoError(t, err)
	stats.Kick()
	eventually(t, "statistics", func() bool { return r.dev.Stats().Updates == 1 })
	r.send(t, qInflate, pfnBytes(3000, 3001))
	r.d.WriteConfig(configActual, []byte{2, 0, 0, 0})

	require.NoError(t, r.d.Queue(qDeflate).SetAvailIdx(1000))
	r.d.Queue(qDeflate).Kick()
	eventually(t, "DEVICE_NEEDS_RESET", func() bool { return r.d.Status()&virtio.StatusDeviceNeedsReset != 0 })

	// The rebooted guest's driver finds an empty balloon and a working
	// device; the old statistics buffer is gone with the old rings.
	r.d.Reset()
	require.NoError(t, r.d.Mem.WriteAt(make([]byte, 1<<20), 0))
	require.Zero(t, r.dev.Counters().BalloonPages)
	require.Zero(t, r.dev.Actual())
	require.False(t, r.dev.RequestStats(), "inactive")
	require.NoError(t, initDriver(r.d, 0, nil))
	r.stillWorks(t)
	stats = r.d.Queue(qStats)
	_, err = stats.Add(virtiotest.Readable(statsBytes([2]uint64{4, 2})))
	require.NoError(t, err)
	stats.Kick()
	eventually(t, "statistics", func() bool { return r.dev.Stats().Updates == 2 })
	require.True(t, r.dev.RequestStats())
	_, err = stats.Wait(testTimeout)
	require.NoError(t, err)
}

func TestGuestErrorsAreRateLimited(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	r := newRig(t, rigOptions{opts: Options{Logger: logs.Logger()}})
	pfns := make([]uint32, 3*ratelog.DefaultBurst)
	for i := range pfns {
		pfns[i] = 0xffffff00 + uint32(i)
	}
	r.send(t, qInflate, pfnBytes(pfns...))
	lines := logs.Lines("page number outside guest RAM refused")
	require.Len(t, lines, ratelog.DefaultBurst, logs.String())
	require.Contains(t, lines[0], "device=virtio-balloon")
}

func TestFailedRunDiscardFallsBackToPages(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.mem.onePage = true
	r.poisonPages(t, 3000, 4)
	r.send(t, qInflate, pfnBytes(3000, 3001, 3002))
	require.Equal(t, []discardCall{
		{3000 * virtio.PageSize, 3 * virtio.PageSize},
		{3000 * virtio.PageSize, virtio.PageSize},
		{3001 * virtio.PageSize, virtio.PageSize},
		{3002 * virtio.PageSize, virtio.PageSize},
	}, r.mem.discards())
	require.Equal(t, "zero", r.page(t, 3002))
	require.Equal(t, "poison", r.page(t, 3003))
	require.EqualValues(t, 3*virtio.PageSize, r.dev.Counters().DiscardedBytes)
}
