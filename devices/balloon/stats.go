package balloon

import (
	"encoding/binary"
	"io"
	"log/slog"
	"maps"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// statsEntrySize is one packed virtio_balloon_stat: le16 tag, le64 value.
const statsEntrySize = 10

// statNames names the tags (virtio 1.2 §5.5.6.3, and Linux 6.12's
// additions 10–15), in tag order. Memory amounts are in bytes, the rest
// are event counts.
var statNames = [...]string{
	"swap_in",             // bytes swapped in
	"swap_out",            // bytes swapped out
	"major_faults",        // page faults that read from disk
	"minor_faults",        // other page faults
	"free_memory",         // bytes unused
	"total_memory",        // bytes of RAM the guest sees
	"available_memory",    // bytes allocatable without swapping
	"caches",              // bytes of disk caches, reclaimable
	"hugetlb_allocations", // huge page allocations
	"hugetlb_failures",    // failed huge page allocations
	"oom_kills",
	"alloc_stalls",
	"async_scans",
	"direct_scans",
	"async_reclaims",
	"direct_reclaims",
}

// Stats are the guest's memory statistics from its last statistics
// buffer.
type Stats struct {
	// Values maps a statistic's name ("free_memory", "available_memory",
	// "caches", "swap_in", …) to its value, for the tags the driver sent.
	Values map[string]uint64
	// Updated is when the buffer arrived (zero: none yet).
	Updated time.Time
	// Updates counts the buffers received since New.
	Updates uint64
}

// Stats returns a copy of the latest statistics.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.Values = maps.Clone(s.Values)
	return s
}

// holdStats parses a statistics buffer and keeps the chain until the next
// request. A driver posts one at a time; if it posts another, the older
// one goes back first, so the device never holds more than one.
func (d *Device) holdStats(a *active, c *virtio.Chain) error {
	if a.heldStats != nil {
		d.log.Warn("virtio-balloon: a second statistics buffer posted; returning the first")
		if err := a.stats.Complete(a.heldStats, 0, a.irq); err != nil {
			return err
		}
	}
	a.heldStats = c
	values, attrs := d.parseStats(c)
	d.mu.Lock()
	d.stats.Values = values
	d.stats.Updated = time.Now()
	d.stats.Updates++
	d.mu.Unlock()
	d.statsLog.Debug("virtio-balloon: guest memory statistics", attrs...)
	return nil
}

// parseStats reads up to MaxStatsEntries entries, once, and returns the
// known tags' values (the last one wins for a repeated tag) and the same
// as log attributes. Unknown tags and a trailing partial entry are
// ignored.
func (d *Device) parseStats(c *virtio.Chain) (map[string]uint64, []any) {
	r := c.Reader()
	var buf [MaxStatsEntries * statsEntrySize]byte
	want := min(r.Remaining(), uint32(len(buf)))
	n, err := io.ReadFull(r, buf[:want])
	if err != nil {
		d.log.Warn("virtio-balloon: reading statistics failed", "err", err)
	}
	values := make(map[string]uint64, len(statNames))
	for at := 0; at+statsEntrySize <= n; at += statsEntrySize {
		tag := binary.LittleEndian.Uint16(buf[at:])
		if int(tag) < len(statNames) {
			values[statNames[tag]] = binary.LittleEndian.Uint64(buf[at+2:])
		}
	}
	attrs := make([]any, 0, len(values))
	for _, name := range statNames {
		if v, ok := values[name]; ok {
			attrs = append(attrs, slog.Uint64(name, v))
		}
	}
	return values, attrs
}
