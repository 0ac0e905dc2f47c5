package balloon

import "github.com/cowork-vmm/cowork-vmm/devices/virtio"

// report discards the free ranges one report names. Linux posts them as
// device-writable buffers (virtqueue_add_inbuf): discarding changes what
// the guest reads there, a write, so a device-readable buffer, which the
// driver did not let the device change, is refused and left alone. Each
// range must be page-aligned (the queue already checked it lies in guest
// memory); a report names at most MaxReportRanges ranges and at most the
// RAM size in all, the rest being refused.
func (d *Device) report(a *active, c *virtio.Chain) {
	if n := len(c.Readable()); n > 0 {
		d.refused.Add(uint64(n))
		d.log.Warn("virtio-balloon: device-readable buffers in a free page report refused", "buffers", n)
	}
	discarder, _ := a.mem.(virtio.Discarder)
	var total uint64
	for i, b := range c.Writable() {
		length := uint64(b.Len)
		switch {
		case i >= MaxReportRanges:
			d.refused.Add(uint64(len(c.Writable()) - i))
			d.log.Warn("virtio-balloon: free page report ranges past the limit refused",
				"ranges", len(c.Writable()), "limit", MaxReportRanges)
			return
		case b.Addr%virtio.PageSize != 0 || length%virtio.PageSize != 0:
			d.refused.Add(1)
			d.log.Warn("virtio-balloon: unaligned free page report range refused", "addr", b.Addr, "len", b.Len)
			continue
		case total+length > d.ramBytes:
			d.refused.Add(1)
			d.log.Warn("virtio-balloon: free page report larger than guest RAM refused", "addr", b.Addr, "len", b.Len, "ram", d.ramBytes)
			continue
		}
		if discarder != nil {
			n, err := discarder.Discard(b.Addr, length)
			if err != nil {
				d.refused.Add(1)
				d.log.Warn("virtio-balloon: discarding a free page report range failed", "addr", b.Addr, "len", b.Len, "err", err)
				continue
			}
			d.discardedBytes.Add(n)
		}
		total += length
		d.reportedBytes.Add(length)
	}
}
