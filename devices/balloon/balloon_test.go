package balloon

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

// Queue indices the driver uses when it negotiated everything.
const (
	qInflate   = 0
	qDeflate   = 1
	qStats     = 2
	qReporting = 3
)

func TestNewRefusesBadOptions(t *testing.T) {
	_, err := New(Options{})
	require.ErrorContains(t, err, "less than a page")
	_, err = New(Options{RAMBytes: 1 << 20, StatsInterval: -time.Second})
	require.ErrorContains(t, err, "negative")
}

func TestOffersFeaturesAndFourQueues(t *testing.T) {
	r := newRig(t, rigOptions{})
	require.Equal(t, virtio.DeviceTypeBalloon, r.dev.Type())
	want := FeatureStatsVQ | FeatureDeflateOnOOM | FeatureReporting
	require.Equal(t, want, r.d.Features()&0xffffff, "negotiated device features")
	require.Len(t, r.dev.QueueMaxSizes(), 4)
}

func TestInflateDiscardsExactlyThosePagesAndCoalesces(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.poisonPages(t, firstFreePFN-1, 20)
	r.send(t, qInflate, pfnBytes(3000, 3001, 3002, 3010, 3005, 3006))

	require.Equal(t, []discardCall{
		{3000 * virtio.PageSize, 3 * virtio.PageSize},
		{3010 * virtio.PageSize, 1 * virtio.PageSize},
		{3005 * virtio.PageSize, 2 * virtio.PageSize},
	}, r.mem.discards())
	for _, pfn := range []uint64{3000, 3001, 3002, 3005, 3006, 3010} {
		require.Equal(t, "zero", r.page(t, pfn), "inflated page %d", pfn)
	}
	for _, pfn := range []uint64{2999, 3003, 3004, 3007, 3008, 3009, 3011} {
		require.Equal(t, "poison", r.page(t, pfn), "neighbour page %d", pfn)
	}
	c := r.dev.Counters()
	require.EqualValues(t, 6, c.InflatedPages)
	require.EqualValues(t, 6, c.BalloonPages)
	require.EqualValues(t, 6*virtio.PageSize, c.DiscardedBytes)
	require.Zero(t, c.Refused)
}

func TestDeflateOnlyAccounts(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.send(t, qInflate, pfnBytes(3000, 3001, 3002, 3003))
	r.poisonPages(t, 3000, 4) // the guest uses its pages again
	r.send(t, qDeflate, pfnBytes(3000, 3001, 3002))
	c := r.dev.Counters()
	require.EqualValues(t, 1, c.BalloonPages)
	require.EqualValues(t, 3, c.DeflatedPages)
	require.Len(t, r.mem.discards(), 1, "deflate discards nothing")
	require.Equal(t, "poison", r.page(t, 3000))

	// Deflating more than was inflated does not go below zero.
	r.send(t, qDeflate, pfnBytes(3004, 3005, 3006))
	require.Zero(t, r.dev.Counters().BalloonPages)
}

func TestMemoryWithoutDiscarderOnlyCounts(t *testing.T) {
	r := newRig(t, rigOptions{plain: true})
	r.poisonPages(t, 3000, 2)
	r.send(t, qInflate, pfnBytes(3000, 3001))
	require.Equal(t, "poison", r.page(t, 3000))
	c := r.dev.Counters()
	require.EqualValues(t, 2, c.BalloonPages)
	require.Zero(t, c.DiscardedBytes)
}

func TestReportingDiscardsRangesAndReturnsChains(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.poisonPages(t, firstFreePFN, 200)
	for range 3 { // the chain comes back each time: the driver can reuse it
		r.sendRaw(t, qReporting, writable(3010, 2), writable(3100, 1))
	}
	for _, pfn := range []uint64{3010, 3011, 3100} {
		require.Equal(t, "zero", r.page(t, pfn), "reported page %d", pfn)
	}
	for _, pfn := range []uint64{3009, 3012, 3099, 3101} {
		require.Equal(t, "poison", r.page(t, pfn), "neighbour page %d", pfn)
	}
	c := r.dev.Counters()
	require.EqualValues(t, 3*3*virtio.PageSize, c.ReportedBytes)
	require.Zero(t, c.BalloonPages, "reported pages are not in the balloon")
	require.NotZero(t, r.d.IRQ.Count())
}

func TestReportingTakesChainsLargerThanTheDefaultCap(t *testing.T) {
	// 32 blocks of 4 MiB, as Linux may report at once: 128 MiB of
	// buffers, over virtio.MaxChainBytes. The test memory is 16 MiB, so
	// the blocks overlap; discards are only recorded.
	r := newRig(t, rigOptions{keep: true, opts: Options{RAMBytes: 1 << 30}})
	descs := make([]virtiotest.Descriptor, 32)
	for i := range descs {
		descs[i] = writable(2048, 1024)
	}
	r.sendRaw(t, qReporting, descs...)
	require.Len(t, r.mem.discards(), 32)
	require.EqualValues(t, 128<<20, r.dev.Counters().ReportedBytes)
}

func TestStatsParsedAndHeldUntilRequested(t *testing.T) {
	r := newRig(t, rigOptions{})
	q := r.d.Queue(qStats)
	buf := append(statsBytes([2]uint64{4, 1 << 30}, [2]uint64{6, 3 << 29}, [2]uint64{7, 12345}, [2]uint64{0, 7},
		[2]uint64{99, 1}), 1, 2, 3) // an unknown tag and a partial entry
	head, err := q.Add(virtiotest.Readable(buf))
	require.NoError(t, err)
	q.Kick()
	eventually(t, "statistics", func() bool { return r.dev.Stats().Updates == 1 })
	s := r.dev.Stats()
	require.Equal(t, map[string]uint64{"free_memory": 1 << 30, "available_memory": 3 << 29, "caches": 12345, "swap_in": 7}, s.Values)
	require.False(t, s.Updated.IsZero())

	time.Sleep(20 * time.Millisecond)
	_, ok, err := q.Poll()
	require.NoError(t, err)
	require.False(t, ok, "the statistics buffer came back before it was asked for")

	require.True(t, r.dev.RequestStats())
	used, err := q.Wait(testTimeout)
	require.NoError(t, err)
	require.Equal(t, head, used.Head)
	require.Zero(t, used.Len)

	// The driver refills and re-posts; the values are replaced.
	_, err = q.Add(virtiotest.Readable(statsBytes([2]uint64{4, 42})))
	require.NoError(t, err)
	q.Kick()
	eventually(t, "second statistics", func() bool { return r.dev.Stats().Updates == 2 })
	require.Equal(t, map[string]uint64{"free_memory": 42}, r.dev.Stats().Values)
}

func TestStatsPostedBeforeDriverOK(t *testing.T) {
	// Linux primes the statistics queue in init_vqs, before DRIVER_OK:
	// that kick reaches no active device, so Activate must look.
	r := newRig(t, rigOptions{beforeOK: func(d *virtiotest.Driver) {
		_, err := d.Queue(qStats).Add(virtiotest.Readable(statsBytes([2]uint64{5, 1 << 31})))
		require.NoError(t, err)
		d.Queue(qStats).Kick()
	}})
	eventually(t, "statistics", func() bool { return r.dev.Stats().Updates == 1 })
	require.Equal(t, uint64(1<<31), r.dev.Stats().Values["total_memory"])
}

func TestStatsIntervalReturnsTheBuffer(t *testing.T) {
	r := newRig(t, rigOptions{opts: Options{StatsInterval: 5 * time.Millisecond}})
	q := r.d.Queue(qStats)
	for round := range 3 {
		_, err := q.Add(virtiotest.Readable(statsBytes([2]uint64{4, uint64(round)})))
		require.NoError(t, err)
		q.Kick()
		_, err = q.Wait(testTimeout)
		require.NoError(t, err, "round %d", round)
	}
	require.EqualValues(t, 3, r.dev.Stats().Updates)
}

func TestRequestStatsBeforeTheBufferArrives(t *testing.T) {
	r := newRig(t, rigOptions{})
	require.True(t, r.dev.RequestStats())
	time.Sleep(10 * time.Millisecond)
	q := r.d.Queue(qStats)
	_, err := q.Add(virtiotest.Readable(statsBytes([2]uint64{4, 1})))
	require.NoError(t, err)
	q.Kick()
	_, err = q.Wait(testTimeout) // the pending request returns it at once
	require.NoError(t, err)
}

func TestSecondStatsBufferReturnsTheFirst(t *testing.T) {
	r := newRig(t, rigOptions{})
	q := r.d.Queue(qStats)
	first, err := q.Add(virtiotest.Readable(statsBytes([2]uint64{4, 1})))
	require.NoError(t, err)
	q.Kick()
	eventually(t, "statistics", func() bool { return r.dev.Stats().Updates == 1 })
	_, err = q.Add(virtiotest.Readable(statsBytes([2]uint64{4, 2})))
	require.NoError(t, err)
	q.Kick()
	used, err := q.Wait(testTimeout)
	require.NoError(t, err)
	require.Equal(t, first, used.Head)
	eventually(t, "second statistics", func() bool { return r.dev.Stats().Updates == 2 })
	require.Equal(t, map[string]uint64{"free_memory": 2}, r.dev.Stats().Values)
}

func readConfig32(d *virtiotest.Driver, offset uint64) uint32 {
	var b [4]byte
	d.ReadConfig(offset, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func TestSetTargetChangesConfigAndSignals(t *testing.T) {
	dev, err := New(Options{RAMBytes: testMemSize})
	require.NoError(t, err)
	dev.SetTarget(100) // inactive: nothing to signal, kept for the driver
	d := virtiotest.New(dev, virtiotest.Options{})
	require.NoError(t, d.Init())
	t.Cleanup(d.Reset)
	require.EqualValues(t, 100, readConfig32(d, configTarget))

	before := d.IRQ.Count()
	dev.SetTarget(1000)
	require.EqualValues(t, 1000, readConfig32(d, configTarget))
	require.EqualValues(t, 1000, dev.Target())
	require.Greater(t, d.IRQ.Count(), before, "no interrupt")
	require.NotZero(t, d.ReadReg(virtio.MMIOInterruptStatus)&virtio.InterruptConfigChange)

	dev.SetTarget(1 << 31) // clamped to the RAM size
	require.EqualValues(t, testMemSize/virtio.PageSize, dev.Target())
}

func TestConfigWritesOnlyActual(t *testing.T) {
	dev, err := New(Options{RAMBytes: testMemSize})
	require.NoError(t, err)
	d := virtiotest.Start(t, dev, virtiotest.Options{})
	dev.SetTarget(7)
	d.WriteConfig(configTarget, []byte{1, 2, 3, 4}) // read-only
	require.EqualValues(t, 7, dev.Target())
	d.WriteConfig(configActual, []byte{0x34, 0x12, 0, 0})
	require.EqualValues(t, 0x1234, dev.Actual())
	require.EqualValues(t, 0x1234, readConfig32(d, configActual))
	d.WriteConfig(configActual+2, []byte{1, 0, 9, 9}) // runs past the end
	require.EqualValues(t, 0x11234, dev.Actual())
	d.WriteConfig(1<<20, []byte{1})
	var past [4]byte
	d.ReadConfig(configSize, past[:])
	require.Equal(t, [4]byte{}, past)
	dev.WriteConfig(^uint64(0), []byte{1, 2}) // offset wraps
	dev.ReadConfig(^uint64(0), past[:])
	require.EqualValues(t, 0x11234, dev.Actual())
}

func TestQueueMappingWithoutStats(t *testing.T) {
	r := newRig(t, rigOptions{refuse: FeatureStatsVQ})
	require.False(t, r.dev.RequestStats())
	r.poisonPages(t, 3000, 2)
	// Reporting is queue 2 now.
	r.sendRaw(t, 2, writable(3000, 1))
	require.Equal(t, "zero", r.page(t, 3000))
	require.EqualValues(t, virtio.PageSize, r.dev.Counters().ReportedBytes)
	// Queue 3 is nobody's.
	require.NoError(t, r.d.Queue(3).WriteDescriptor(0, writable(3001, 1)))
	require.NoError(t, r.d.Queue(3).PublishHead(0))
	r.d.Queue(3).Kick()
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, "poison", r.page(t, 3001))
}

func TestQueueMappingWithoutReporting(t *testing.T) {
	r := newRig(t, rigOptions{refuse: FeatureReporting})
	q := r.d.Queue(qStats)
	_, err := q.Add(virtiotest.Readable(statsBytes([2]uint64{4, 9})))
	require.NoError(t, err)
	q.Kick()
	eventually(t, "statistics", func() bool { return r.dev.Stats().Updates == 1 })
	r.poisonPages(t, 3000, 1)
	require.NoError(t, r.d.Queue(qReporting).WriteDescriptor(0, writable(3000, 1)))
	require.NoError(t, r.d.Queue(qReporting).PublishHead(0))
	r.d.Queue(qReporting).Kick()
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, "poison", r.page(t, 3000), "queue 3 is not the reporting queue")
}

// TestQuiesceHandsTheStatsBufferBack: a snapshot's Quiesce returns the
// held statistics buffer, so the queue has nothing in flight.
func TestQuiesceHandsTheStatsBufferBack(t *testing.T) {
	r := newRig(t, rigOptions{})
	q := r.d.Queue(qStats)
	head, err := q.Add(virtiotest.Readable(statsBytes([2]uint64{4, 1 << 20})))
	require.NoError(t, err)
	q.Kick()
	eventually(t, "statistics", func() bool { return r.dev.Stats().Updates == 1 })
	var quiescer virtio.Quiescer = r.dev
	quiescer.Quiesce()
	used, err := q.Wait(testTimeout)
	require.NoError(t, err)
	require.Equal(t, head, used.Head, "the held buffer is back")
}
