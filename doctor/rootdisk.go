package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
)

// The profiles' root disks (helper/rootdisk.go): the root-disks check lists
// them and --reset-root removes one. Both work by descriptor beneath the
// data directory's profiles directory (internal/beneath), never following
// a symlink, and tell a disk in use by the lock every VM holds on its disk
// (helper.LockRootDisk): doctor takes it for an instant, so a VM starting
// in that instant starts without its disk (read-only root, logged).

// maxProfiles bounds the profiles one listing looks at.
const maxProfiles = 4096

// ResetAll as --reset-root's PROFILE resets every profile's root disk. No
// profile directory is named so: profile ids end in "-<hash>".
const ResetAll = "all"

// RootDisk is one profile's root disk as doctor finds it.
type RootDisk struct {
	// Profile is the profile's directory name under profiles/ (its id).
	Profile string
	Path    string
	// Size is the image's apparent size; Allocated the host bytes its
	// blocks take (st_blocks × 512: it is sparse).
	Size, Allocated int64
	// InUse: a VM holds the disk's lock now.
	InUse bool
	// Err is why the disk could not be looked at (a symlink, not a regular
	// file); "" when it was.
	Err string
}

// heldDisk is a profile's root disk open by descriptor and, unless a VM
// holds it (inUse), locked by us until close.
type heldDisk struct {
	dir   *beneath.Dir // the profile's directory
	file  *os.File
	st    unix.Stat_t
	inUse bool
}

// openProfiles opens dataDir's profiles directory; nil when there is none.
func openProfiles(dataDir string) (*beneath.Dir, error) {
	d, err := beneath.Open(filepath.Join(dataDir, helper.ProfilesDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return d, err
}

// profileNames lists the profile directories of profiles, sorted; a
// symlink there is no profile.
func profileNames(profiles *beneath.Dir) ([]string, error) {
	entries, err := profiles.Entries(maxProfiles)
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name)
		}
	}
	slices.Sort(names)
	return names, err
}

// holdRootDisk opens the root disk of profile beneath profiles and tries
// its lock; nil, nil when the profile has no disk. A symlink as the
// profile's directory or as its disk is refused, not followed.
func holdRootDisk(profiles *beneath.Dir, profile string) (*heldDisk, error) {
	dir, err := profiles.OpenDir(profile)
	if err != nil {
		return nil, fmt.Errorf("the profile's directory: %w", noFollowErr(err))
	}
	f, st, err := dir.OpenFile(helper.RootDiskFile)
	if err != nil {
		dir.Close()
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, noFollowErr(err)
	}
	h := &heldDisk{dir: dir, file: f, st: st}
	err = helper.LockRootDisk(f)
	h.inUse = errors.Is(err, helper.ErrRootDiskInUse)
	if err != nil && !h.inUse {
		h.close()
		return nil, err
	}
	return h, nil
}

// noFollowErr is an open's error without the path the caller names
// already, saying why a symlink was refused: it is never followed.
func noFollowErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("not followed (a symlink, or on another file system): %w", err)
	}
	return err
}

// close releases the disk (and our lock on it).
func (h *heldDisk) close() {
	h.file.Close()
	h.dir.Close()
}

// ListRootDisks lists the root disks of the profiles in dataDir (Host's
// RootDisks on this machine); none when there is no profiles directory.
func ListRootDisks(dataDir string) ([]RootDisk, error) {
	profiles, err := openProfiles(dataDir)
	if profiles == nil || err != nil {
		return nil, err
	}
	defer profiles.Close()
	names, err := profileNames(profiles)
	var disks []RootDisk
	for _, name := range names {
		if d, ok := lookAtRootDisk(profiles, dataDir, name); ok {
			disks = append(disks, d)
		}
	}
	return disks, err
}

// lookAtRootDisk describes the root disk of profile; false when it has none.
func lookAtRootDisk(profiles *beneath.Dir, dataDir, profile string) (RootDisk, bool) {
	d := RootDisk{Profile: profile, Path: rootDiskPath(dataDir, profile)}
	h, err := holdRootDisk(profiles, profile)
	if err != nil {
		d.Err = err.Error()
		return d, true
	}
	if h == nil {
		return d, false
	}
	defer h.close()
	d.Size, d.Allocated, d.InUse = h.st.Size, h.st.Blocks*512, h.inUse
	return d, true
}

func rootDiskPath(dataDir, profile string) string {
	return filepath.Join(dataDir, helper.ProfilesDir, profile, helper.RootDiskFile)
}

// rootDiskCheck lists each profile's root disk: its size, what it takes on
// the host, whether a VM uses it now. It never fails: the disks are the
// guests' state, not something the helper needs.
func (r *runner) rootDiskCheck() {
	c := Check{ID: CheckRootDisks, Group: GroupCoworkVMM, Title: "Root disks (kvm backend)", Status: StatusOK}
	defer func() { r.add(c) }()
	dir, err := r.h.DataDir()
	if err != nil {
		c.Status, c.Detail = StatusSkip, "no data directory: "+err.Error()
		return
	}
	where := filepath.Join(dir, helper.ProfilesDir)
	disks, err := r.h.RootDisks(dir)
	if err != nil {
		c.Status = StatusWarn
		c.Detail = fmt.Sprintf("cannot list the root disks in %s: %v", where, err)
		return
	}
	c.Detail = rootDisksDetail(where, disks)
	if strings.EqualFold(r.h.Getenv(helper.RootDiskEnv), "off") {
		c.Detail += "; " + helper.RootDiskEnv + "=off: guests start without one"
	}
	for _, d := range disks {
		if d.Err != "" {
			c.Status = StatusWarn
			c.Fix = "a root disk is a regular file the helper made: look at what stands there and remove it by hand"
		}
	}
}

// rootDisksDetail is the root-disks finding: each disk, relative to where.
func rootDisksDetail(where string, disks []RootDisk) string {
	if len(disks) == 0 {
		return "none in " + where + " (a profile's first VM start makes its disk)"
	}
	parts := make([]string, 0, len(disks))
	for _, d := range disks {
		name := d.Profile + "/" + helper.RootDiskFile
		switch {
		case d.Err != "":
			parts = append(parts, name+": "+d.Err)
		case d.InUse:
			parts = append(parts, fmt.Sprintf("%s %s, %s on the host, in use by a running VM", name, humanBytes(uint64(d.Size)), humanBytes(uint64(d.Allocated))))
		default:
			parts = append(parts, fmt.Sprintf("%s %s, %s on the host, not in use", name, humanBytes(uint64(d.Size)), humanBytes(uint64(d.Allocated))))
		}
	}
	return fmt.Sprintf("%d in %s: %s; `cowork-vmm doctor --reset-root PROFILE` (or %s) removes one not in use, for a clean root",
		len(disks), where, strings.Join(parts, "; "), ResetAll)
}
