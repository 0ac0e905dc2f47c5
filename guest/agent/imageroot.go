package agent

// The client's bundle image as the guest's userland (SetupParams.ImageRoot:
// the VM booting the desktop client's VM bundle).
//
// The image's root volume is a virtio-blk disk whose writes the host keeps
// in the profile's copy-on-write layer: the client's image is never
// written. The agent mounts it ext4 read-write in its private staging
// directory (a journal that needs recovery is replayed there, into the
// layer), mounts the bundle's other images where the image's /etc/fstab
// says (by LABEL=, beneath the image, so the binds below carry them), and
// binds the image's top-level directories, or makes its top-level
// symlinks, at the guest's root in place of the host's system
// directories. Spawns then see the image's /etc (its passwd, hosts), its
// /usr and /opt, and write to them as root through sudo.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

const (
	// imageDir is where the agent mounts the image's root volume.
	imageDir = stagingDir + "/image"
	// imageMountFlags: no device nodes or set-uid files of the image
	// take effect (sessions' sudo is the agent's, sudo.go).
	imageMountFlags = unix.MS_NOSUID | unix.MS_NODEV
	// maxFstabBytes bounds the image's /etc/fstab read.
	maxFstabBytes = 64 << 10
	// maxImages bounds ImageRoot.Images.
	maxImages = 16
	// maxLabelBytes is an ext4 label's size (s_volume_name).
	maxLabelBytes = 16
	// imageAgentDir is the agent's own directory in the image's root, out
	// of the spawns' sight (only imageSystemDirs are bound): the sessions'
	// /tmp lives there (sessiontmp.go), as on the root disk.
	imageAgentDir = imageDir + "/.cowork-vmm"
)

// imageSystemDirs are the image's top-level entries that become the
// guest's system directories (a directory is bound, a symlink made as
// such); the rest of the guest's root (/dev, /proc, /sys, /tmp, /run,
// /sessions) stays the agent's.
var imageSystemDirs = []string{"usr", "etc", "opt", "var", "home", "root", "srv",
	"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// validateImageRoot checks the helper's ImageRoot: serials the agent can
// look up, at most maxImages other images, each with a label fstab can
// name, none twice.
func validateImageRoot(r protocol.ImageRoot) error {
	if err := checkSerial(r.Serial); err != nil {
		return fmt.Errorf("image root: %w", err)
	}
	if len(r.Images) > maxImages {
		return fmt.Errorf("image root: %d other images, at most %d", len(r.Images), maxImages)
	}
	serials := []string{r.Serial}
	var labels []string
	for _, img := range r.Images {
		if err := checkSerial(img.Serial); err != nil {
			return fmt.Errorf("image %q: %w", img.Label, err)
		}
		if img.Label == "" || len(img.Label) > maxLabelBytes || strings.ContainsAny(img.Label, "\x00/") {
			return fmt.Errorf("image %s: label %q must be 1 to %d bytes without NUL or '/'", img.Serial, img.Label, maxLabelBytes)
		}
		if slices.Contains(serials, img.Serial) || slices.Contains(labels, img.Label) {
			return fmt.Errorf("image %s (%q): serial or label given twice", img.Serial, img.Label)
		}
		serials, labels = append(serials, img.Serial), append(labels, img.Label)
	}
	return nil
}

// checkSerial accepts a virtio-blk serial: 1 to 20 printable ASCII bytes
// without spaces.
func checkSerial(s string) error {
	if s == "" || len(s) > 20 {
		return fmt.Errorf("disk serial %q must be 1 to 20 bytes", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return fmt.Errorf("disk serial %q must be printable ASCII without spaces", s)
		}
	}
	return nil
}

// stageImage mounts the image's root volume at imageDir and the other
// images where its fstab says, and returns the system mounts that make
// its top-level directories the guest's.
func (m *mounter) stageImage(r protocol.ImageRoot, timer *stepTimer) ([]protocol.Mount, error) {
	dev, err := findDisk(r.Serial)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount(dev, imageDir, "ext4", imageMountFlags, ""); err != nil {
		return nil, fmt.Errorf("mounting the bundle image's root %s: %w", dev, err)
	}
	m.syncDirs = append(m.syncDirs, imageDir)
	timer.done("image.mount")
	m.mountFstabImages(r.Images)
	timer.done("image.fstab")
	return imageSystemMounts(imageDir)
}

// startImageSessionTmp puts the sessions' /tmp on the image's disk (its
// writes in the profile's layer), in imageAgentDir.
func (m *mounter) startImageSessionTmp() error {
	if err := os.MkdirAll(imageAgentDir, 0o700); err != nil {
		return err
	}
	return m.startSessionTmp(imageAgentDir)
}

// imageSystemMounts lists the system mounts of the image mounted at dir:
// each of imageSystemDirs it has, a writable bind of a directory or a
// symlink as the image has it.
func imageSystemMounts(dir string) ([]protocol.Mount, error) {
	var system []protocol.Mount
	for _, name := range imageSystemDirs {
		p := path.Join(dir, name)
		st, err := os.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, err
		case st.Mode()&os.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return nil, err
			}
			system = append(system, protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindSymlink, Path: link}, Target: "/" + name})
		case st.IsDir():
			system = append(system, protocol.Mount{Source: protocol.MountSource{Kind: protocol.MountKindBind, Path: p}, Target: "/" + name})
		}
	}
	if len(system) == 0 {
		return nil, errors.New("the bundle image's root holds none of the system directories (usr, etc, …)")
	}
	for _, mt := range system {
		if err := validateMount(mt); err != nil {
			return nil, err
		}
	}
	return system, nil
}

// fstabEntry is one line of an fstab this agent acts on.
type fstabEntry struct {
	label, target, fsType string
	readOnly              bool
}

// parseFstab reads the entries of an fstab that name a filesystem by
// LABEL= and mount it at an absolute, clean path other than "/"; other
// lines are returned as skipped, with why (the root, swap, UUID= sources).
// Octal escapes (\040) are decoded as mount(8) does.
func parseFstab(r io.Reader) (entries []fstabEntry, skipped []string) {
	sc := bufio.NewScanner(io.LimitReader(r, maxFstabBytes))
	sc.Buffer(make([]byte, 0, 4096), maxFstabBytes)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			skipped = append(skipped, fmt.Sprintf("%q: fewer than 3 fields", line))
			continue
		}
		src, target, fsType := unescapeFstab(f[0]), unescapeFstab(f[1]), f[2]
		label, ok := strings.CutPrefix(src, "LABEL=")
		switch {
		case target == "/":
			continue // the root itself
		case !ok || label == "":
			skipped = append(skipped, fmt.Sprintf("%s at %s: only LABEL= sources are mounted", src, target))
		case checkGuestPath(target) != nil:
			skipped = append(skipped, fmt.Sprintf("%s: mount point %q is not an absolute clean path", src, target))
		default:
			e := fstabEntry{label: label, target: target, fsType: fsType}
			if len(f) > 3 {
				e.readOnly = slices.Contains(strings.Split(f[3], ","), "ro")
			}
			entries = append(entries, e)
		}
	}
	if sc.Err() != nil {
		skipped = append(skipped, "the rest: "+sc.Err().Error())
	}
	return entries, skipped
}

// unescapeFstab decodes fstab's octal escapes (\040 is a space).
func unescapeFstab(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// isExtType: an fstab type the ext4 driver mounts ("auto": the images
// handed over are ext4 by construction).
func isExtType(t string) bool { return t == "ext4" || t == "ext3" || t == "ext2" || t == "auto" }

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// mountFstabImages mounts each of images where the image's fstab names
// its label, beneath imageDir. What cannot be mounted is logged and
// skipped: the guest boots without it.
func (m *mounter) mountFstabImages(images []protocol.ImageDisk) {
	raw, err := readImageFile(imageDir, "/etc/fstab")
	if err != nil {
		if len(images) > 0 {
			m.log.Warn("the bundle's other images are not mounted: no fstab", "err", err)
		}
		return
	}
	entries, skipped := parseFstab(bytes.NewReader(raw))
	plan, unmatched := planFstabMounts(entries, images)
	for _, s := range append(skipped, unmatched...) {
		m.log.Info("an fstab entry of the bundle image is not mounted", "entry", s)
	}
	for _, p := range plan {
		if err := m.mountImageAt(p.serial, p.entry); err != nil {
			m.log.Warn("an image of the bundle is not mounted", "label", p.entry.label, "at", p.entry.target, "err", err)
		}
	}
}

// fstabMount is an fstab entry matched to the disk of an image.
type fstabMount struct {
	serial string
	entry  fstabEntry
}

// planFstabMounts matches fstab entries to images by label: each image at
// the first ext2/3/4 entry naming its label (a disk is one file system,
// mounted once). The other entries are returned as skipped, with why.
func planFstabMounts(entries []fstabEntry, images []protocol.ImageDisk) (plan []fstabMount, skipped []string) {
	mounted := make(map[string]bool)
	for _, e := range entries {
		i := slices.IndexFunc(images, func(d protocol.ImageDisk) bool { return d.Label == e.label })
		switch {
		case !isExtType(e.fsType):
			skipped = append(skipped, fmt.Sprintf("LABEL=%s at %s: type %q, only ext2/3/4 images are mounted", e.label, e.target, e.fsType))
		case i < 0:
			skipped = append(skipped, fmt.Sprintf("LABEL=%s at %s: no image of the bundle has that label", e.label, e.target))
		case mounted[images[i].Serial]:
			skipped = append(skipped, fmt.Sprintf("LABEL=%s at %s: that image is mounted already", e.label, e.target))
		default:
			mounted[images[i].Serial] = true
			plan = append(plan, fstabMount{serial: images[i].Serial, entry: e})
		}
	}
	return plan, skipped
}

// mountImageAt mounts the disk serial names (ext4) at e.target beneath the
// image's root, its directories made as needed, no symlink followed.
func (m *mounter) mountImageAt(serial string, e fstabEntry) error {
	if !isExtType(e.fsType) {
		return fmt.Errorf("file system type %q: only ext2/3/4 images are mounted", e.fsType)
	}
	dev, err := findDisk(serial)
	if err != nil {
		return err
	}
	root, err := openRoot(imageDir)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	dst, err := walkDir(root, e.target, 0o755)
	if err != nil {
		return err
	}
	defer dst.close()
	flags := uintptr(imageMountFlags)
	if e.readOnly {
		flags |= unix.MS_RDONLY
	}
	target := fmt.Sprintf("/proc/self/fd/%d", dst.fd)
	if err := unix.Mount(dev, target, "ext4", flags, ""); err != nil {
		return fmt.Errorf("mounting %s: %w", dev, err)
	}
	if !e.readOnly {
		m.syncDirs = append(m.syncDirs, path.Join(imageDir, e.target))
	}
	m.log.Info("mounted an image of the bundle", "label", e.label, "at", e.target)
	return nil
}

// readImageFile reads the regular file p (at most maxFstabBytes) of the
// image mounted at dir, no symlink followed on the way.
func readImageFile(dir, p string) ([]byte, error) {
	root, err := openRoot(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	parent, err := walkDir(root, path.Dir(p), noMkdir)
	if err != nil {
		return nil, err
	}
	defer parent.close()
	fd, err := openComponent(parent.fd, path.Base(p), 0)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	return io.ReadAll(io.LimitReader(f, maxFstabBytes))
}
