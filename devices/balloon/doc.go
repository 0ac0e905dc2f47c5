// Package balloon is the virtio memory balloon device (virtio-balloon,
// device id 5): the host asks the guest to give memory back and the guest
// reports what it gave and what it does not use.
//
// It owns:
//   - the configuration space: num_pages, the host's target in 4 KiB
//     pages (SetTarget), and actual, what the driver says it holds
//     (Actual);
//   - the inflate and deflate queues: page frame numbers of 4 KiB pages the
//     driver puts in or takes out of the balloon. Inflated pages are given
//     back to the host at once through virtio.Discarder (runs of
//     consecutive pages in one call); deflated ones are only counted, as
//     the guest faults them back in;
//   - the statistics queue (VIRTIO_BALLOON_F_STATS_VQ): the driver's one
//     buffer of tagged values, parsed and held until RequestStats (or the
//     StatsInterval ticker) hands it back so the driver refills it;
//   - the free page reporting queue (VIRTIO_BALLOON_F_REPORTING): ranges of
//     free guest memory, discarded and handed back.
//
// DEFLATE_ON_OOM is offered too; it only changes what the driver does.
// MUST_TELL_HOST, FREE_PAGE_HINT and PAGE_POISON are not offered.
//
// It does not own guest memory: the VMM's memory implements Discarder
// (madvise); without it the device only counts.
//
// Queue indices: Linux's virtio-mmio find_vqs numbers only the queues the
// driver uses, so a queue whose feature was not negotiated takes no index.
// Activate maps queues by the negotiated features: inflate 0, deflate 1,
// then statistics at the next index if STATS_VQ was negotiated, then
// reporting at the next index if REPORTING was (so without STATS_VQ,
// reporting is queue 2).
//
// Everything the guest sends is hostile: page numbers outside guest RAM,
// unaligned or oversized report ranges and floods are refused or bounded
// (MaxPagesPerChain, MaxReportRanges, at most the RAM size per report),
// logged through internal/ratelog, and the device keeps working; a broken
// queue asks for a reset (Interrupt.NeedsReset).
package balloon
