package vm

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/devices/blk"
	"github.com/cowork-vmm/cowork-vmm/devices/blk/cow"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/vm/bundle"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Booting the client's VM bundle (issue #41): the root volume of the
// bundle's root image becomes the guest's userland, served over
// virtio-blk through a copy-on-write layer (devices/blk/cow) whose
// overlay is a file of the profile's; each other ext4 image of the
// bundle gets a disk and an overlay of its own. The images are opened
// read-only and never written.

const (
	// BundleLayersDir is the directory of a profile's layers over the
	// bundle's images, in its profile directory (beside its root disk).
	BundleLayersDir = "bundle"
	// RootImageSerial is the virtio-blk serial of the bundle's root volume.
	RootImageSerial = "cowork-image-root"
	// imageSerialPrefix begins the serial of another image's disk, the
	// rest derived from its label (imageSerial).
	imageSerialPrefix = "cwimg-"
	// maxBundleImages bounds the other images attached (each a device).
	maxBundleImages = 8
	// BundleSourceFile, in a profile's layer directory, holds the bundle
	// directory the client last passed (startVM's bundlePath), so that
	// doctor can tell which userland the profile's guest will use.
	BundleSourceFile = "source"
	// MaxBundleSource bounds BundleSourceFile (a path).
	MaxBundleSource = 4096
)

// imageDisk is one image volume served to the guest: the image open
// read-only, the profile's overlay open and locked, and the cow disk over
// both.
type imageDisk struct {
	serial, label string
	// identity is the served volume's (cow.Base.Identity).
	identity      string
	base, overlay *os.File
	disk          *cow.Disk
}

// bundleDisks are the disks of a guest booting the bundle: its root
// volume first.
type bundleDisks struct {
	dir   string
	disks []*imageDisk
	// throwaway is the temporary directory of layers made for a helper
	// that keeps no state (cowork-vmm run), removed at close; "" for a
	// profile's own.
	throwaway string
}

var _ helper.BundleBooter = (*Backend)(nil)

// BootsBundles implements helper.BundleBooter.
func (b *Backend) BootsBundles() bool { return true }

// openBundle opens the bundle at dir for a guest of the profile whose
// directory is profileDir: nil (the guest uses the host's directories)
// when there is none, or when it cannot be used, with the reason logged.
func (b *Backend) openBundle(dir, profileDir string) *bundleDisks {
	if dir == "" {
		return nil
	}
	if err := recordBundleSource(dir, profileDir); err != nil {
		b.log.Debug("doctor will not know the profile's bundle", "err", err)
	}
	bd, err := openBundleDisks(dir, profileDir, b.log)
	if err != nil {
		b.log.Warn("the client's VM bundle is not booted: the guest uses the host's system directories", "bundlePath", dir, "reason", err)
		return nil
	}
	root := bd.disks[0]
	b.log.Info("booting the client's VM bundle: the guest's userland is its root image", "bundlePath", dir,
		"root", root.base.Name(), "images", len(bd.disks)-1)
	return bd
}

// recordBundleSource writes dir as the profile's BundleSourceFile (whole,
// by rename); nothing for a helper that keeps no state.
func recordBundleSource(dir, profileDir string) error {
	if profileDir == "" || len(dir) > MaxBundleSource {
		return nil
	}
	layers := filepath.Join(profileDir, BundleLayersDir)
	if err := os.MkdirAll(layers, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(layers, BundleSourceFile+".new")
	if err := os.WriteFile(tmp, []byte(dir), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(layers, BundleSourceFile))
}

// DescribeBundle says whether the bundle at dir can be booted, and why
// (doctor): its root image's root volume and the reason it was chosen,
// or why the guest uses the host's directories instead. It reads as the
// backend does, without opening any layer.
func DescribeBundle(dir string) (bool, string) {
	b, err := bundle.Read(dir)
	if err != nil {
		return false, err.Error()
	}
	why := fmt.Sprintf("%s, %s (label %q): %s", b.Root.Image, b.Root.Volume.Describe(), b.Root.Volume.FS.Label, b.Root.Reason)
	if b.Root.Volume.FS.NeedsRecovery {
		why += "; its journal needs recovery, which the guest replays into the profile's layer"
	}
	if n := len(b.Others); n > 0 {
		why += fmt.Sprintf("; %d other image(s)", n)
	}
	return true, why
}

// openBundleDisks opens the root volume of dir's root image and each other
// ext4 image's first labelled volume, each with its overlay in
// profileDir (without one, a helper that keeps no state, in a temporary
// directory removed at close: the guest's changes last one boot). An
// error means the bundle cannot be booted: nothing is left open. Another
// image that cannot be opened is logged and left out.
func openBundleDisks(dir, profileDir string, log *slog.Logger) (_ *bundleDisks, err error) {
	rootPath := filepath.Join(dir, bundle.RootImageName)
	if _, err := os.Stat(rootPath); errors.Is(err, os.ErrNotExist) {
		return nil, bundle.ErrNoRootImage
	}
	bd := &bundleDisks{dir: dir}
	layers := filepath.Join(profileDir, BundleLayersDir)
	if profileDir == "" {
		if bd.throwaway, err = os.MkdirTemp("", "cowork-vmm-bundle-"); err != nil {
			return nil, fmt.Errorf("a temporary layer directory: %w", err)
		}
		layers = bd.throwaway
	} else if err := os.MkdirAll(layers, 0o700); err != nil {
		return nil, fmt.Errorf("the profile's layer directory: %w", err)
	}
	root, err := openImageDisk(rootPath, layers, RootImageSerial, "", log)
	if err != nil {
		_ = bd.close()
		return nil, err
	}
	bd.disks = append(bd.disks, root)
	read, err := bundle.Read(dir)
	if err != nil {
		log.Warn("the bundle's other images are not mounted", "err", err)
		return bd, nil
	}
	for _, s := range read.Skipped {
		log.Warn("a file of the bundle is not mounted", "file", s.Name, "reason", s.Reason)
	}
	for _, other := range read.Others {
		if len(bd.disks) > maxBundleImages {
			log.Warn("too many images in the bundle: the rest are not mounted", "max", maxBundleImages, "file", other.Path)
			break
		}
		bd.addOther(other, layers, log)
	}
	return bd, nil
}

// addOther attaches the image other of the bundle: its first volume with
// a label that gives a serial no other disk has.
func (bd *bundleDisks) addOther(other bundle.Image, layers string, log *slog.Logger) {
	for _, v := range other.Volumes {
		serial, ok := imageSerial(v.FS.Label)
		if !ok || bd.hasSerial(serial) {
			continue
		}
		d, err := openImageDisk(other.Path, layers, serial, v.FS.Label, log)
		if err != nil {
			log.Warn("an image of the bundle is not mounted", "file", other.Path, "err", err)
			return
		}
		bd.disks = append(bd.disks, d)
		return
	}
	log.Warn("an image of the bundle is not mounted: no volume with a usable label", "file", other.Path)
}

func (bd *bundleDisks) hasSerial(serial string) bool {
	for _, d := range bd.disks {
		if d.serial == serial {
			return true
		}
	}
	return false
}

// imageSerial derives a disk's serial from its volume's label: the
// prefix and the label's letters, digits, '.', '_' and '-', within
// blk.IDBytes. false for a label that leaves nothing.
func imageSerial(label string) (string, bool) {
	var sb strings.Builder
	sb.WriteString(imageSerialPrefix)
	for _, r := range label {
		if sb.Len() >= blk.IDBytes {
			break
		}
		if r < 0x80 && (r == '.' || r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			sb.WriteRune(r)
		}
	}
	if sb.Len() == len(imageSerialPrefix) {
		return "", false
	}
	return sb.String(), true
}

// openImageDisk opens the image at path read-only, inspects it and serves
// its volume (the root volume for the root image, else the one labelled
// label) through its overlay layers/<serial>.cow.
func openImageDisk(path, layers, serial, label string, log *slog.Logger) (_ *imageDisk, err error) {
	base, err := bundle.OpenImage(path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			base.Close()
		}
	}()
	img, err := bundle.Inspect(base)
	if err != nil {
		return nil, err
	}
	vol, err := chooseVolume(img, label, serial == RootImageSerial)
	if err != nil {
		return nil, err
	}
	cb := cow.Base{File: base, Offset: vol.Offset(), Length: vol.Length(),
		Identity: fmt.Sprintf("%s %s", img.Identity, vol.Describe())}
	overlay, disk, err := openOverlay(cb, filepath.Join(layers, serial+".cow"), log)
	if err != nil {
		return nil, err
	}
	if vol.FS.NeedsRecovery {
		log.Info("the bundle image's journal needs recovery: the guest replays it into the profile's layer, the image stays as it is",
			"image", path)
	}
	return &imageDisk{serial: serial, label: label, identity: cb.Identity, base: base, overlay: overlay, disk: disk}, nil
}

// chooseVolume is img's root volume (root) or its volume labelled label.
func chooseVolume(img bundle.Image, label string, root bool) (bundle.Volume, error) {
	if root {
		r, err := bundle.SelectRoot(img)
		if err != nil {
			return bundle.Volume{}, err
		}
		return r.Volume, nil
	}
	for _, v := range img.Volumes {
		if v.FS.Label == label {
			return v, nil
		}
	}
	return bundle.Volume{}, fmt.Errorf("%s: no volume labelled %q", img.Path, label)
}

// openOverlay opens (creating it) the overlay at path, locked, and the cow
// disk of base over it. An overlay made for another image is moved aside
// (renamed with the time, never merged, never deleted) and a fresh one
// started, logged.
func openOverlay(base cow.Base, path string, log *slog.Logger) (*os.File, *cow.Disk, error) {
	f, err := openLayerFile(path)
	if err != nil {
		return nil, nil, err
	}
	disk, err := cow.Open(base, f)
	if errors.Is(err, cow.ErrMismatch) {
		f.Close()
		aside, aerr := setAside(path, time.Now())
		if aerr != nil {
			return nil, nil, aerr
		}
		log.Warn("the bundle's image changed: the profile's layer over the old image is kept aside and a fresh one started",
			"layer", path, "keptAs", aside, "reason", err)
		if f, err = openLayerFile(path); err != nil {
			return nil, nil, err
		}
		disk, err = cow.Open(base, f)
	}
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("the profile's layer %s: %w", path, err)
	}
	return f, disk, nil
}

// setAside renames the layer at path to path.<time>.old, a name no other
// layer has, and returns it.
func setAside(path string, now time.Time) (string, error) {
	stamp := now.UTC().Format("20060102T150405.000000000Z")
	aside := path + "." + stamp + ".old"
	if err := unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, aside, unix.RENAME_NOREPLACE); err != nil {
		return "", fmt.Errorf("keeping the profile's layer %s aside: %w", path, err)
	}
	return aside, nil
}

// openLayerFile opens (creating it) a layer file for reading and writing,
// locked against a second VM as a root disk is (helper.LockRootDisk); a
// symlink is not followed, what is not a regular file is refused.
func openLayerFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the profile's layer: %w", err)
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("the profile's layer %s is not a regular file", path)
	}
	if err == nil {
		err = helper.LockRootDisk(f)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// attach adds a virtio-blk device per disk to m.
func (bd *bundleDisks) attach(m *machine.Machine, log *slog.Logger) error {
	for _, d := range bd.disks {
		dev, err := blk.NewBacked(d.disk, blk.Options{Serial: d.serial, Logger: log})
		if err != nil {
			return err
		}
		if _, err := m.AddVirtioMMIO(dev); err != nil {
			return fmt.Errorf("attaching the bundle's disk %s: %w", d.serial, err)
		}
	}
	return nil
}

// identity names the images the guest boots, each by its serial and the
// identity of the volume served (which its layer was made for).
func (bd *bundleDisks) identity() string {
	var ids []string
	for _, d := range bd.disks {
		ids = append(ids, d.serial+"="+d.identity)
	}
	return strings.Join(ids, ", ")
}

// layerPaths are the profile's layer files, the guest's writes.
func (bd *bundleDisks) layerPaths() []string {
	var paths []string
	for _, d := range bd.disks {
		paths = append(paths, d.overlay.Name())
	}
	return paths
}

// imageRoot is what the agent is told of the disks.
func (bd *bundleDisks) imageRoot() *protocol.ImageRoot {
	r := &protocol.ImageRoot{Serial: bd.disks[0].serial}
	for _, d := range bd.disks[1:] {
		r.Images = append(r.Images, protocol.ImageDisk{Serial: d.serial, Label: d.label})
	}
	return r
}

// close commits each overlay's map, syncs and closes the overlays and the
// images; called once the machine has stopped (or was never attached).
func (bd *bundleDisks) close() error {
	var errs []error
	for _, d := range bd.disks {
		if err := d.disk.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := d.overlay.Sync(); err != nil {
			errs = append(errs, err)
		}
		d.overlay.Close()
		d.base.Close()
	}
	if bd.throwaway != "" {
		if err := os.RemoveAll(bd.throwaway); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
