package cow

import "fmt"

// Discard and write-zeroes act per cluster. A cluster the range covers
// whole becomes Zero, which reads as zeros and holds nothing: its overlay
// copy, if any, is punched to give the space back. A cluster the range
// covers in part keeps its state: in the overlay the range is punched or
// zeroed there; outside it, write-zeroes copies the cluster up with the
// range zeroed, and discard (advisory) leaves it as it is.
//
// Crash: a punch may reach the disk before the map that stops naming the
// cluster, so until the next commit the cluster reads as zeros or as its
// old bytes, both allowed for a range discarded or zeroed since.

// Discard implements blk.Backing. Discarded clusters read as zeros
// afterwards, never as the base's bytes: ext4 and fstrim see what a thin
// disk gives them, and the overlay stops holding what was freed.
func (d *Disk) Discard(off, size int64) error {
	return d.eachCluster(off, size, func(c, from, n int64, whole bool) error {
		switch {
		case whole:
			return d.toZero(c)
		case d.state(c) == statePresent:
			return d.overlay.Discard(d.l.dataOffset+from, n)
		}
		return nil
	})
}

// WriteZeroes implements blk.Backing: the range reads as zeros after,
// whatever was under it. Without unmap, a whole cluster in the overlay is
// zeroed in place (it stays allocated, as the guest asked).
func (d *Disk) WriteZeroes(off, size int64, unmap bool) error {
	return d.eachCluster(off, size, func(c, from, n int64, whole bool) error {
		s := d.state(c)
		switch {
		case s == statePresent && (!whole || !unmap):
			return d.overlay.WriteZeroes(d.l.dataOffset+from, n, unmap)
		case whole:
			return d.toZero(c)
		case s == stateBase:
			return d.copyUp(c, from, n, nil)
		}
		return nil // part of a Zero cluster
	})
}

// toZero makes cluster c Zero, punching its overlay copy.
func (d *Disk) toZero(c int64) error {
	if d.state(c) == statePresent {
		start, length := d.span(c)
		if err := d.overlay.Discard(d.l.dataOffset+start, length); err != nil {
			return err
		}
	}
	d.setState(c, stateZero)
	return nil
}

// eachCluster calls fn for each cluster [off, off+size) touches, with the
// part of the range in it and whether that is the whole cluster.
func (d *Disk) eachCluster(off, size int64, fn func(c, from, n int64, whole bool) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.check(off, size); err != nil {
		return err
	}
	for end := off + size; off < end; {
		c := off / ClusterSize
		start, length := d.span(c)
		stop := min(start+length, end)
		if err := fn(c, off, stop-off, off == start && stop == start+length); err != nil {
			return fmt.Errorf("cow: cluster %d: %w", c, err)
		}
		off = stop
	}
	return nil
}
