package doctor

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/helper"
)

// Reset is what --reset-root did with one profile's root disk.
type Reset struct {
	Profile string
	Path    string
	// Freed is the host bytes the removal gave back (the image's blocks;
	// none when another hard link keeps them).
	Freed int64
	// Err is why the disk was not removed; nil when it was.
	Err error
}

// checkProfileName refuses what is not one profile directory's name: a
// name with '/' or ".." could reach past the profiles directory.
func checkProfileName(profile string) error {
	if profile == "" || profile == "." || strings.Contains(profile, "..") || strings.ContainsAny(profile, "/\x00") {
		return fmt.Errorf("%q is not a profile: give the name of a directory in profiles/ (no '/' or '..'), or %s", profile, ResetAll)
	}
	return nil
}

// ResetRoot removes the root disk of profile (a profile directory's name,
// or ResetAll) in dataDir unless a VM uses it, so that the profile's next
// VM starts on a clean root. It works by descriptor beneath the profiles
// directory and follows no symlink: a symlinked profile directory or disk
// is refused and what it points to left alone. The error is for the whole
// call (a bad name, no such profile); each disk's outcome is in its Reset.
// A profile without a disk has nothing to reset: no Reset for it.
func ResetRoot(dataDir, profile string) ([]Reset, error) {
	if err := checkProfileName(profile); err != nil {
		return nil, err
	}
	profiles, err := openProfiles(dataDir)
	if err != nil {
		return nil, err
	}
	if profiles == nil {
		if profile == ResetAll {
			return nil, nil
		}
		return nil, fmt.Errorf("no profile %q: %s has no profiles", profile, dataDir)
	}
	defer profiles.Close()
	names := []string{profile}
	if profile == ResetAll {
		if names, err = profileNames(profiles); err != nil {
			return nil, err
		}
	}
	var out []Reset
	for _, name := range names {
		r := Reset{Profile: name, Path: rootDiskPath(dataDir, name)}
		h, err := holdRootDisk(profiles, name)
		switch {
		case err != nil:
			r.Err = err
		case h == nil:
			continue
		default:
			r.Freed, r.Err = h.remove()
			h.close()
		}
		out = append(out, r)
	}
	return out, nil
}

// remove unlinks the disk h holds the lock of, and returns the host
// bytes that frees.
func (h *heldDisk) remove() (int64, error) {
	if h.inUse {
		return 0, fmt.Errorf("%w: stop the VM first", helper.ErrRootDiskInUse)
	}
	// The name may have been replaced since it was opened: remove it only
	// while it is still the file whose lock we hold.
	now, err := h.dir.Stat(helper.RootDiskFile)
	if err != nil {
		return 0, err
	}
	if now.Stat.Dev != h.st.Dev || now.Stat.Ino != h.st.Ino {
		return 0, errors.New("replaced while doctor looked at it: try again")
	}
	if err := h.dir.Remove(helper.RootDiskFile); err != nil {
		return 0, err
	}
	if h.st.Nlink > 1 {
		return 0, nil
	}
	return h.st.Blocks * 512, nil
}

// resetRootMain is --reset-root: it removes the disks, says what it did and
// returns the exit status (1 when a disk was refused or could not be
// removed, 2 for a bad name).
func resetRootMain(h Host, profile string, stdout, stderr io.Writer) int {
	if err := checkProfileName(profile); err != nil {
		fmt.Fprintf(stderr, "cowork-vmm doctor: --reset-root: %v\n", err)
		return 2
	}
	dir, err := h.DataDir()
	if err != nil {
		fmt.Fprintf(stderr, "cowork-vmm doctor: --reset-root: %v\n", err)
		return 1
	}
	resets, err := ResetRoot(dir, profile)
	if err != nil {
		fmt.Fprintf(stderr, "cowork-vmm doctor: --reset-root: %v\n", err)
		return 1
	}
	return reportResets(resets, profile, stdout, stderr)
}

// reportResets prints each Reset and returns the exit status.
func reportResets(resets []Reset, profile string, stdout, stderr io.Writer) int {
	if len(resets) == 0 {
		fmt.Fprintf(stdout, "no root disk to remove (%s): the next VM starts on a clean root already\n", profile)
		return 0
	}
	code, removed := 0, 0
	var freed int64
	for _, r := range resets {
		if r.Err != nil {
			fmt.Fprintf(stderr, "cowork-vmm doctor: not removed: %s: %v\n", r.Path, r.Err)
			code = 1
			continue
		}
		removed++
		freed += r.Freed
		fmt.Fprintf(stdout, "removed %s: freed %s (%d bytes); the profile's next VM starts on a clean root\n", r.Path, humanBytes(uint64(r.Freed)), r.Freed)
	}
	if removed > 1 {
		fmt.Fprintf(stdout, "freed %s (%d bytes) in all\n", humanBytes(uint64(freed)), freed)
	}
	return code
}
