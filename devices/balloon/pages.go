package balloon

import (
	"encoding/binary"
	"io"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// readPFNs copies up to MaxPagesPerChain page numbers (little-endian
// uint32) out of the chain's readable buffers, once, and returns them as
// raw bytes, 4 a page. Bytes past the cap or a trailing partial number are
// refused and logged.
func (d *Device) readPFNs(a *active, c *virtio.Chain, queue string) []byte {
	r := c.Reader()
	total := r.Remaining()
	want := min(total, uint32(len(a.pfnBuf))) &^ 3
	buf := a.pfnBuf[:want]
	n, err := io.ReadFull(r, buf)
	if err != nil {
		d.log.Warn("virtio-balloon: reading page numbers failed", "queue", queue, "err", err)
	}
	buf = buf[:n&^3]
	if rest := total - uint32(len(buf)); rest > 0 && err == nil {
		d.refused.Add((uint64(rest) + 3) / 4)
		d.log.Warn("virtio-balloon: page numbers past the per-chain limit or a partial one refused",
			"queue", queue, "bytes", total, "limit", MaxPagesPerChain)
	}
	return buf
}

// pageInRAM reports an error unless the 4 KiB page at gpa lies in guest
// RAM, using the memory's RangeChecker or else probing its two ends.
func pageInRAM(mem virtio.GuestMemory, gpa uint64) error {
	if rc, ok := mem.(virtio.RangeChecker); ok {
		return rc.CheckRange(gpa, virtio.PageSize)
	}
	var probe [1]byte
	if err := mem.ReadAt(probe[:], gpa); err != nil {
		return err
	}
	return mem.ReadAt(probe[:], gpa+virtio.PageSize-1)
}

// validPages calls run for each maximal run of consecutive valid page
// numbers in pfns (runs are what one Discard can take) and returns how
// many were valid. Page numbers outside RAM are refused and logged.
func (d *Device) validPages(a *active, pfns []byte, queue string, run func(first, count uint64)) uint64 {
	var first, count, valid uint64
	for i := 0; i+4 <= len(pfns); i += 4 {
		pfn := uint64(binary.LittleEndian.Uint32(pfns[i:]))
		if err := pageInRAM(a.mem, pfn*virtio.PageSize); err != nil {
			d.refused.Add(1)
			d.log.Warn("virtio-balloon: page number outside guest RAM refused", "queue", queue, "pfn", pfn, "err", err)
			continue
		}
		valid++
		if count > 0 && pfn == first+count {
			count++
			continue
		}
		if count > 0 {
			run(first, count)
		}
		first, count = pfn, 1
	}
	if count > 0 {
		run(first, count)
	}
	return valid
}

// inflate gives the chain's pages back to the host and counts them.
func (d *Device) inflate(a *active, c *virtio.Chain) {
	pfns := d.readPFNs(a, c, "inflate")
	discarder, _ := a.mem.(virtio.Discarder)
	valid := d.validPages(a, pfns, "inflate", func(first, count uint64) {
		if discarder != nil {
			d.discardPages(discarder, first, count)
		}
	})
	d.inflatedPages.Add(valid)
	d.balloonPages.Store(min(d.balloonPages.Load()+valid, d.ramPages()))
}

// discardPages discards a run in one call, or page by page if that fails
// (a run may cross from one RAM region into an adjacent one). What goes is
// counted: on a host with larger pages, only the whole host pages a run
// covers.
func (d *Device) discardPages(discarder virtio.Discarder, first, count uint64) {
	if n, err := discarder.Discard(first*virtio.PageSize, count*virtio.PageSize); err == nil {
		d.discardedBytes.Add(n)
		return
	}
	for pfn := first; pfn < first+count; pfn++ {
		n, err := discarder.Discard(pfn*virtio.PageSize, virtio.PageSize)
		if err != nil {
			d.log.Warn("virtio-balloon: discarding an inflated page failed", "pfn", pfn, "err", err)
			continue
		}
		d.discardedBytes.Add(n)
	}
}

// deflate counts the chain's pages out of the balloon; the guest faults
// them back in when it touches them.
func (d *Device) deflate(a *active, c *virtio.Chain) {
	pfns := d.readPFNs(a, c, "deflate")
	valid := d.validPages(a, pfns, "deflate", func(first, count uint64) {})
	d.deflatedPages.Add(valid)
	d.balloonPages.Store(d.balloonPages.Load() - min(valid, d.balloonPages.Load()))
}
