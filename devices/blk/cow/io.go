package cow

import "fmt"

// A request is cut into runs: consecutive clusters that one host call
// serves (one preadv of the base or the overlay, one pwritev of the
// overlay, or zeros). The guest's buffers are never copied but for the
// partial write of a cluster not yet in the overlay, which is merged with
// the cluster's bytes in a scratch cluster and written whole.

// iovLen is the total length of iov.
func iovLen(iov [][]byte) int64 {
	var n int64
	for _, b := range iov {
		n += int64(len(b))
	}
	return n
}

// take returns the first n bytes of *iov as a new list (d.part, reused)
// and drops them from *iov. *iov holds at least n bytes.
func (d *Disk) take(iov *[][]byte, n int64) [][]byte {
	part := d.part[:0]
	rest := *iov
	for n > 0 && len(rest) > 0 {
		b := rest[0]
		if int64(len(b)) > n {
			part = append(part, b[:n])
			rest[0] = b[n:]
			break
		}
		part = append(part, b)
		n -= int64(len(b))
		rest = rest[1:]
	}
	*iov = rest
	d.part = part
	return part
}

// runEnd returns the end of the run from off (before end) whose clusters
// all have the state of off's cluster.
func (d *Disk) runEnd(off, end int64) int64 {
	s := d.state(off / ClusterSize)
	next := (off/ClusterSize + 1) * ClusterSize
	for next < end && d.state(next/ClusterSize) == s {
		next += ClusterSize
	}
	return min(next, end)
}

// ReadV implements blk.Backing: each run from where its clusters live.
func (d *Disk) ReadV(iov [][]byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	size := iovLen(iov)
	if err := d.check(off, size); err != nil {
		return 0, err
	}
	end := off + size
	done := 0
	for off < end {
		stop := d.runEnd(off, end)
		part := d.take(&iov, stop-off)
		var err error
		switch d.state(off / ClusterSize) {
		case statePresent:
			_, err = d.overlay.ReadV(part, d.l.dataOffset+off)
		case stateZero:
			for _, b := range part {
				clear(b)
			}
		default:
			_, err = d.base.ReadV(part, d.baseOff+off)
		}
		if err != nil {
			return done, fmt.Errorf("cow: reading [%d, %d): %w", off, stop, err)
		}
		done += int(stop - off)
		off = stop
	}
	return done, nil
}

// WriteV implements blk.Backing. Clusters in the overlay, and clusters
// the write covers whole, take the guest's buffers straight; a partial
// write to any other cluster copies it up first (copyUp).
func (d *Disk) WriteV(iov [][]byte, off int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	size := iovLen(iov)
	if err := d.check(off, size); err != nil {
		return err
	}
	end := off + size
	for off < end {
		stop, direct := d.writeRun(off, end)
		part := d.take(&iov, stop-off)
		var err error
		if direct {
			err = d.overlay.WriteV(part, d.l.dataOffset+off)
		} else {
			err = d.copyUp(off/ClusterSize, off, stop-off, part)
		}
		if err != nil {
			return fmt.Errorf("cow: writing [%d, %d): %w", off, stop, err)
		}
		for c := off / ClusterSize; c*ClusterSize < stop; c++ {
			d.setState(c, statePresent)
		}
		off = stop
	}
	return nil
}

// writeRun returns the end of the run of a write [off, end) that starts
// at off, and whether it goes straight to the overlay (direct) or is one
// cluster to copy up.
func (d *Disk) writeRun(off, end int64) (int64, bool) {
	stop := off
	for stop < end {
		c := stop / ClusterSize
		start, length := d.span(c)
		covered := stop == start && end >= start+length
		if d.state(c) != statePresent && !covered {
			if stop == off {
				return min(start+length, end), false
			}
			break
		}
		stop = min(start+length, end)
	}
	return stop, true
}

// copyUp writes cluster c whole into the overlay: its current bytes (the
// base's, or zeros) with the n bytes at off replaced by part's (nil:
// zeros). Until a commit the map on disk does not name the cluster, so a
// crash meanwhile leaves it reading what it did before.
func (d *Disk) copyUp(c, off, n int64, part [][]byte) error {
	start, length := d.span(c)
	buf := d.cluster[:length]
	if d.state(c) == stateBase {
		d.single[0] = buf
		if _, err := d.base.ReadV(d.single[:], d.baseOff+start); err != nil {
			return fmt.Errorf("copying cluster %d up from the base: %w", c, err)
		}
	} else {
		clear(buf)
	}
	at := buf[off-start : off-start+n]
	if part == nil {
		clear(at)
	}
	for _, b := range part {
		at = at[copy(at, b):]
	}
	d.single[0] = buf
	if err := d.overlay.WriteV(d.single[:], d.l.dataOffset+start); err != nil {
		return err
	}
	d.setState(c, statePresent)
	return nil
}
