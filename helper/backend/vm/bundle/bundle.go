package bundle

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// RootImageName is the bundle's root image, beside which other images may
// lie.
const RootImageName = "rootfs.img"

// maxBundleEntries bounds the directory entries Read looks at, so that a
// bundle directory with a million files costs a bounded listing.
const maxBundleEntries = 256

// ErrNoRootImage says the bundle directory holds no RootImageName: not a
// bundle this package boots (the guest keeps the host's directories).
var ErrNoRootImage = errors.New("no " + RootImageName)

// Bundle is a VM bundle directory, read: its root image and root volume,
// and the other images beside it.
type Bundle struct {
	Dir       string
	RootImage Image
	Root      Root
	// Others are the other files of the directory that are disk images
	// with at least one ext4 volume, by name. The guest mounts them where
	// the root's fstab says, by label.
	Others []Image
	// Skipped are the files that look like images (or could not be read
	// to tell) but hold no usable ext4 volume, each with why. Files that
	// are not disk images at all (ErrNotImage) are left out silently.
	Skipped []Skipped
	// LabelClashes name each ext4 label held by more than one volume the
	// guest would see (the root, and the volumes of Others): a mount by
	// such a label is ambiguous in the guest.
	LabelClashes []string
}

// Skipped is a file of the bundle that was not used, and why.
type Skipped struct {
	Name, Reason string
}

// Read reads the bundle at dir: RootImageName (its table, volumes, root
// and identity; any error here is the bundle's error, wrapping
// ErrNoRootImage when the file is missing) and every other regular file
// of dir (at most maxBundleEntries entries are looked at). Files are opened
// read-only and closed before it returns.
func Read(dir string) (Bundle, error) {
	b := Bundle{Dir: dir}
	rootPath := filepath.Join(dir, RootImageName)
	img, err := inspectPath(rootPath)
	if errors.Is(err, os.ErrNotExist) {
		return Bundle{}, fmt.Errorf("%s: %w", dir, ErrNoRootImage)
	}
	if err != nil {
		return Bundle{}, err
	}
	b.RootImage = img
	if b.Root, err = SelectRoot(img); err != nil {
		return Bundle{}, err
	}
	b.Others, b.Skipped, err = readOthers(dir)
	if err != nil {
		return Bundle{}, err
	}
	b.LabelClashes = labelClashes(b.Root, b.Others)
	return b, nil
}

// labelClashes lists the labels held by more than one of root and the
// volumes of others, each with where it is.
func labelClashes(root Root, others []Image) []string {
	where := map[string][]string{root.FS.Label: {fmt.Sprintf("%s of %s", root.Describe(), filepath.Base(root.Image))}}
	order := []string{root.FS.Label}
	for _, img := range others {
		for _, v := range img.Volumes {
			if _, seen := where[v.FS.Label]; !seen {
				order = append(order, v.FS.Label)
			}
			where[v.FS.Label] = append(where[v.FS.Label], fmt.Sprintf("%s of %s", v.Describe(), filepath.Base(img.Path)))
		}
	}
	var clashes []string
	for _, label := range order {
		if len(where[label]) > 1 {
			clashes = append(clashes, fmt.Sprintf("label %q is on %s", label, strings.Join(where[label], ", ")))
		}
	}
	return clashes
}

// readOthers inspects every file of dir but the root image.
func readOthers(dir string) ([]Image, []Skipped, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	defer d.Close()
	entries, err := d.ReadDir(maxBundleEntries + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	var skipped []Skipped
	if len(entries) > maxBundleEntries {
		entries = entries[:maxBundleEntries]
		skipped = append(skipped, Skipped{Name: dir, Reason: fmt.Sprintf("more than %d entries; only %d are looked at", maxBundleEntries, maxBundleEntries)})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var images []Image
	for _, e := range entries {
		if e.Name() == RootImageName || !(e.Type().IsRegular() || e.Type()&os.ModeSymlink != 0) {
			continue
		}
		img, err := inspectPath(filepath.Join(dir, e.Name()))
		switch {
		case errors.Is(err, ErrNotImage) || errors.Is(err, errNotRegular):
		case err != nil:
			skipped = append(skipped, Skipped{Name: e.Name(), Reason: err.Error()})
		case len(img.Volumes) == 0:
			skipped = append(skipped, Skipped{Name: e.Name(), Reason: noExt4Error(img).Error()})
		default:
			images = append(images, img)
		}
	}
	return images, skipped, nil
}

func inspectPath(path string) (Image, error) {
	f, err := OpenImage(path)
	if err != nil {
		return Image{}, err
	}
	defer f.Close()
	return Inspect(f)
}

// errNotRegular says a path is not a regular file (after symlinks).
var errNotRegular = errors.New("not a regular file")

// OpenImage opens the image at path read-only, following symlinks, and
// only if it is a regular file: a FIFO or a device is refused before it is
// opened (opening either can block or have effects), and the open file is
// checked again. It is opened O_NONBLOCK (so that a FIFO swapped in between
// the check and the open cannot block it), which changes nothing for the
// regular file it returns.
func OpenImage(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w (%s)", path, errNotRegular, st.Mode().Type())
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	if st, err = f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w (changed while opened)", path, errNotRegular)
	}
	return f, nil
}

// Summary describes the bundle in a few lines for doctor and the log: the
// root and why, each other image's ext4 labels, each skipped file and why,
// each label clash.
// Labels are quoted, so no byte of the image reaches a terminal raw.
func (b Bundle) Summary() []string {
	lines := []string{fmt.Sprintf("root: %s", b.Root.Reason)}
	for _, img := range b.Others {
		for _, v := range img.Volumes {
			lines = append(lines, fmt.Sprintf("image %s, %s: ext4 labelled %q", filepath.Base(img.Path), v.Describe(), v.FS.Label))
		}
	}
	for _, s := range b.Skipped {
		lines = append(lines, fmt.Sprintf("skipped %s: %s", s.Name, s.Reason))
	}
	for _, c := range b.LabelClashes {
		lines = append(lines, "ambiguous: "+c)
	}
	return lines
}
