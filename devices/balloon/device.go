package balloon

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// Feature bits (virtio 1.2 §5.5.3).
const (
	FeatureStatsVQ      uint64 = 1 << 1 // VIRTIO_BALLOON_F_STATS_VQ
	FeatureDeflateOnOOM uint64 = 1 << 2 // VIRTIO_BALLOON_F_DEFLATE_ON_OOM
	FeatureReporting    uint64 = 1 << 5 // VIRTIO_BALLOON_F_REPORTING
)

// Queue slots in QueueMaxSizes order. The index the driver uses for the
// last two depends on the negotiated features (see the package doc).
const (
	slotInflate = iota
	slotDeflate
	slotStats
	slotReporting
	slotCount
)

// QueueSize is the largest size offered for every queue. Linux sends at
// most 256 page numbers a buffer and needs at least 32 entries on the
// reporting queue.
const QueueSize = 256

// Limits on what one chain may make the device do.
const (
	// MaxPagesPerChain caps the page numbers read from one inflate or
	// deflate chain (Linux sends at most 256); the rest are refused.
	MaxPagesPerChain = 4096
	// MaxReportRanges caps the buffers of one free page report (Linux
	// sends at most 32); the rest are refused.
	MaxReportRanges = 256
	// MaxReportChainBytes is the reporting queue's cap on a chain's total
	// buffer length (the default virtio.MaxChainBytes is too small: Linux
	// reports up to 32 blocks of 4 MiB at once). A report is further
	// bounded by the RAM size.
	MaxReportChainBytes = 1 << 30
	// MaxStatsEntries caps the entries parsed from one statistics buffer
	// (the spec defines 16 tags); the rest are ignored.
	MaxStatsEntries = 64
)

// configSize is the configuration space: num_pages and actual, both
// little-endian uint32.
const (
	configSize   = 8
	configTarget = 0
	configActual = 4
)

// Options configure New.
type Options struct {
	// RAMBytes is the guest's RAM size; required. It bounds the pages the
	// device counts as ballooned, the target and each free page report.
	RAMBytes uint64
	// StatsInterval, when positive, asks the driver for fresh statistics
	// that often (as RequestStats does); 0 asks only on RequestStats.
	StatsInterval time.Duration
	// Logger receives guest errors (rate-limited) and the statistics (at
	// debug level); nil means slog.Default().
	Logger *slog.Logger
}

// Counters are the device's running totals since New (BalloonPages since
// the last Reset).
type Counters struct {
	// BalloonPages is how many 4 KiB pages the balloon holds by the
	// device's count: inflated minus deflated, never below 0 nor above
	// the RAM size (a driver inflating one page twice is not believed
	// twice).
	BalloonPages uint64
	// InflatedPages and DeflatedPages count the valid page numbers
	// received on each queue.
	InflatedPages uint64
	DeflatedPages uint64
	// DiscardedBytes is what inflating and free page reports gave back
	// to the host through virtio.Discarder.
	DiscardedBytes uint64
	// ReportedBytes is the total length of the accepted free page report
	// ranges.
	ReportedBytes uint64
	// Refused counts page numbers and report ranges refused as invalid.
	Refused uint64
}

// Device is a virtio-balloon device. Create it with New; it implements
// virtio.Device.
type Device struct {
	ramBytes      uint64
	statsInterval time.Duration
	log           *ratelog.Logger // guest errors, rate-limited
	statsLog      *slog.Logger
	worker        virtio.Worker

	mu     sync.Mutex
	config [configSize]byte
	irq    virtio.Interrupt // the active driver's; nil when inactive
	stats  Stats
	// hasStatsQueue: the active driver negotiated STATS_VQ.
	hasStatsQueue bool

	statsWanted    atomic.Bool // RequestStats called; the worker acts
	balloonPages   atomic.Uint64
	inflatedPages  atomic.Uint64
	deflatedPages  atomic.Uint64
	discardedBytes atomic.Uint64
	reportedBytes  atomic.Uint64
	refused        atomic.Uint64
}

var _ virtio.Device = (*Device)(nil)

// New returns an inactive device for a guest with opts.RAMBytes of RAM.
func New(opts Options) (*Device, error) {
	if opts.RAMBytes < virtio.PageSize {
		return nil, fmt.Errorf("virtio-balloon: guest RAM of %d bytes is less than a page", opts.RAMBytes)
	}
	if opts.StatsInterval < 0 {
		return nil, fmt.Errorf("virtio-balloon: negative statistics interval %v", opts.StatsInterval)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("device", "virtio-balloon")
	return &Device{
		ramBytes:      opts.RAMBytes,
		statsInterval: opts.StatsInterval,
		log:           ratelog.New(logger, nil),
		statsLog:      logger,
	}, nil
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.DeviceTypeBalloon }

// Features implements virtio.Device.
func (d *Device) Features() uint64 {
	return FeatureStatsVQ | FeatureDeflateOnOOM | FeatureReporting
}

// QueueMaxSizes implements virtio.Device: inflate, deflate, statistics and
// reporting, in that order (see the package doc for the indices the
// driver actually uses).
func (d *Device) QueueMaxSizes() []uint16 {
	return []uint16{QueueSize, QueueSize, QueueSize, QueueSize}
}

// ramPages is the RAM size in 4 KiB pages.
func (d *Device) ramPages() uint64 { return d.ramBytes / virtio.PageSize }

// ReadConfig implements virtio.Device.
func (d *Device) ReadConfig(offset uint64, data []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if offset < configSize {
		copy(data, d.config[offset:])
	}
}

// WriteConfig implements virtio.Device: the driver may write actual; the
// rest (num_pages, bytes past the space) is read-only and ignored.
func (d *Device) WriteConfig(offset uint64, data []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, b := range data {
		at := offset + uint64(i)
		if at < offset || at >= configSize {
			return
		}
		if at >= configActual {
			d.config[at] = b
		}
	}
}

// SetTarget sets num_pages, the balloon size (in 4 KiB pages) the host
// wants, clamped to the RAM size, and tells an active driver through the
// configuration interrupt. The driver then inflates or deflates towards it.
func (d *Device) SetTarget(pages uint32) {
	pages = uint32(min(uint64(pages), d.ramPages()))
	d.mu.Lock()
	defer d.mu.Unlock()
	binary.LittleEndian.PutUint32(d.config[configTarget:], pages)
	if d.irq != nil {
		d.irq.SignalConfig()
	}
}

// Target returns num_pages as last set by SetTarget.
func (d *Device) Target() uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return binary.LittleEndian.Uint32(d.config[configTarget:])
}

// Actual returns the balloon size in 4 KiB pages the driver last wrote
// (its claim, not checked; Counters().BalloonPages is the device's count).
func (d *Device) Actual() uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return binary.LittleEndian.Uint32(d.config[configActual:])
}

// Counters returns the running totals.
func (d *Device) Counters() Counters {
	return Counters{
		BalloonPages:   d.balloonPages.Load(),
		InflatedPages:  d.inflatedPages.Load(),
		DeflatedPages:  d.deflatedPages.Load(),
		DiscardedBytes: d.discardedBytes.Load(),
		ReportedBytes:  d.reportedBytes.Load(),
		Refused:        d.refused.Load(),
	}
}

// RequestStats asks the driver for fresh statistics: the worker hands the
// held statistics buffer back, and the driver refills and re-posts it
// (Stats then shows the new values). If the driver has not posted one yet,
// the request waits for it. It reports false when the device is not active
// or the driver did not negotiate VIRTIO_BALLOON_F_STATS_VQ.
func (d *Device) RequestStats() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.irq == nil || !d.hasStatsQueue {
		return false
	}
	d.statsWanted.Store(true)
	d.worker.Wake()
	return true
}

// Quiesce implements virtio.Quiescer: the worker hands the held
// statistics buffer back (as for RequestStats), so that a snapshot finds
// nothing in flight; the driver re-posts it when it runs again.
func (d *Device) Quiesce() { d.RequestStats() }

// Activate implements virtio.Device: it maps the queues by the negotiated
// features and starts the worker.
func (d *Device) Activate(mem virtio.GuestMemory, irq virtio.Interrupt, queues []*virtio.Queue, features uint64) error {
	a, err := mapQueues(queues, features)
	if err != nil {
		return err
	}
	a.mem, a.irq = mem, irq
	if a.reporting != nil {
		a.reporting.SetMaxChainBytes(MaxReportChainBytes)
	}
	d.mu.Lock()
	d.irq = irq
	d.hasStatsQueue = a.stats != nil
	d.mu.Unlock()
	if err := d.worker.Start(func(wake, stop <-chan struct{}) { d.serve(a, wake, stop) }); err != nil {
		d.deactivate()
		return err
	}
	return nil
}

// mapQueues picks each queue by the negotiated features (see the package
// doc): a feature's queue takes the next index only when negotiated.
func mapQueues(queues []*virtio.Queue, features uint64) (*active, error) {
	if len(queues) != slotCount {
		return nil, fmt.Errorf("virtio-balloon: %d queues, want %d", len(queues), slotCount)
	}
	if queues[slotInflate] == nil || queues[slotDeflate] == nil {
		return nil, errors.New("virtio-balloon: the driver did not enable the inflate and deflate queues")
	}
	a := &active{inflate: queues[slotInflate], deflate: queues[slotDeflate]}
	next := slotStats
	if features&FeatureStatsVQ != 0 {
		a.stats = queues[next]
		next++
	}
	if features&FeatureReporting != 0 {
		a.reporting = queues[next]
	}
	return a, nil
}

// Notify implements virtio.Device: it wakes the worker, which serves every
// queue.
func (d *Device) Notify(queue int) { d.worker.Wake() }

// Reset implements virtio.Device: it stops the worker (dropping a held
// statistics buffer, which belonged to the old rings) and forgets the
// balloon: the next driver starts with an empty one.
func (d *Device) Reset() {
	d.worker.Stop()
	d.deactivate()
}

func (d *Device) deactivate() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.irq = nil
	d.hasStatsQueue = false
	binary.LittleEndian.PutUint32(d.config[configActual:], 0)
	d.statsWanted.Store(false)
	d.balloonPages.Store(0)
}
