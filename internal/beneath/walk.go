package beneath

import (
	"errors"
	"io/fs"

	"golang.org/x/sys/unix"
)

// walk is what one RemoveAll or SizeOf call may still spend.
type walk struct {
	left int    // entries it may still look at
	dev  uint64 // the filesystem SizeOf stays on
}

func newWalk() *walk { return &walk{left: maxVisits} }

// visit spends one entry.
func (w *walk) visit() error {
	if w.left <= 0 {
		return ErrTooMany
	}
	w.left--
	return nil
}

// beforeDescend runs before a walk opens the directory name of d (a hook
// for tests that swap it).
var beforeDescend = func(d *Dir, name string) {}

// descend opens the directory name of d for a walk at depth.
func (d *Dir) descend(name string, depth int) (*Dir, error) {
	if depth >= MaxDepth {
		return nil, d.err("openat2", name, ErrTooDeep)
	}
	beforeDescend(d, name)
	return d.OpenDir(name)
}

// RemoveAll removes the entry name of d and, for a directory, everything
// beneath it. A symlink anywhere is removed itself, never its target: each
// directory is entered with openat2 relative to its parent's descriptor,
// so one swapped for a symlink (or a mount point) makes RemoveAll fail
// there. A name that does not exist is no error.
func (d *Dir) RemoveAll(name string) error {
	if err := checkName(name); err != nil {
		return d.err("unlinkat", name, err)
	}
	return d.remove(name, newWalk(), 0)
}

// remove removes the entry name of d, a directory at depth.
func (d *Dir) remove(name string, w *walk, depth int) error {
	if err := w.visit(); err != nil {
		return d.err("unlinkat", name, err)
	}
	err := d.unlink(name, 0)
	if !errors.Is(err, unix.EISDIR) {
		return ignoreNotExist(err)
	}
	sub, err := d.descend(name, depth)
	if err != nil {
		return ignoreNotExist(err)
	}
	err = sub.removeEntries(w, depth+1)
	sub.Close()
	if err != nil {
		return err
	}
	return ignoreNotExist(d.unlink(name, unix.AT_REMOVEDIR))
}

// removeEntries removes every entry of d, in passes from its start until a
// pass finds nothing left or fails (a pass is repeated in case removals
// hid entries from the directory's read position).
func (d *Dir) removeEntries(w *walk, depth int) error {
	for {
		removed, err := d.removePass(w, depth)
		if err != nil || removed == 0 {
			return err
		}
		if err := d.rewind(); err != nil {
			return err
		}
	}
}

// removePass removes the entries of d from its read position on, going
// past failures; it returns how many it removed and the first failure.
func (d *Dir) removePass(w *walk, depth int) (int, error) {
	removed := 0
	var first error
	for {
		names, err := d.readNames(batchNames)
		if err != nil || len(names) == 0 {
			return removed, errors.Join(first, err)
		}
		for _, n := range names {
			switch err := d.remove(n, w, depth); {
			case err == nil:
				removed++
			case errors.Is(err, ErrTooMany):
				return removed, err
			case first == nil:
				first = err
			}
		}
	}
}

// SizeOf is the apparent size (st_size) of the entry name of d plus, for
// a directory, of everything beneath it on d's filesystem. A symlink counts
// as itself; what cannot be read, lies deeper than MaxDepth, is past the
// entries one call looks at, or is swapped mid-walk is left out: the figure
// is an estimate.
func (d *Dir) SizeOf(name string) int64 {
	var st unix.Stat_t
	if checkName(name) != nil || unix.Fstat(d.fd, &st) != nil {
		return 0
	}
	w := newWalk()
	w.dev = st.Dev
	return d.size(name, w, 0)
}

// size is SizeOf of the entry name of d, a directory at depth.
func (d *Dir) size(name string, w *walk, depth int) int64 {
	e, err := d.Stat(name)
	if err != nil || e.Stat.Dev != w.dev || w.visit() != nil {
		return 0
	}
	if !e.IsDir() {
		return e.Stat.Size
	}
	sub, err := d.descend(name, depth)
	if err != nil {
		return e.Stat.Size
	}
	defer sub.Close()
	return e.Stat.Size + sub.sizeEntries(w, depth+1)
}

// sizeEntries sums size over the entries of d.
func (d *Dir) sizeEntries(w *walk, depth int) int64 {
	var total int64
	for w.left > 0 {
		names, err := d.readNames(batchNames)
		if err != nil || len(names) == 0 {
			break
		}
		for _, n := range names {
			total += d.size(n, w, depth)
		}
	}
	return total
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
