package beneath

import (
	"errors"
	"time"
)

// Pruned is what one PruneOlder call did.
type Pruned struct {
	Freed int64   // apparent bytes removed (SizeOf of each entry removed)
	Tried int     // entries it tried to remove
	Errs  []error // the failures among them
}

// PruneOlder removes the entries of d last modified at or before cutoff,
// each with what lies beneath it, looking at no more than max entries (a
// guest can make millions; the rest wait for the next call).
func (d *Dir) PruneOlder(cutoff time.Time, max int) Pruned {
	var r Pruned
	entries, _ := d.Entries(max)
	for _, e := range entries {
		if !e.ModTime().After(cutoff) {
			r.Remove(d, e.Name)
		}
	}
	return r
}

// Remove removes the entry name of dir, with what lies beneath it, and
// counts what it freed.
func (r *Pruned) Remove(dir *Dir, name string) {
	r.Tried++
	size := dir.SizeOf(name)
	if err := dir.RemoveAll(name); err != nil {
		r.Errs = append(r.Errs, err)
		return
	}
	r.Freed += size
}

// Add counts what another prune did into r.
func (r *Pruned) Add(o Pruned) {
	r.Freed += o.Freed
	r.Tried += o.Tried
	r.Errs = append(r.Errs, o.Errs...)
}

// RemovedAny says whether at least one entry it tried went.
func (r Pruned) RemovedAny() bool { return r.Tried > len(r.Errs) }

// Err joins the failures; nil when there were none.
func (r Pruned) Err() error { return errors.Join(r.Errs...) }
