package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/helper/backend/vm"
	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
)

// Userland is which userland a profile's kvm guest will use: the client's
// bundle image (the bundlePath it last passed, when it can be booted) or
// the host's system directories, and why.
type Userland struct {
	// Profile is the profile's directory name under profiles/.
	Profile string
	// Bundle is the bundle directory the client last passed; "" when it
	// passed none yet.
	Bundle string
	// Image: the bundle's image will be the guest's userland.
	Image bool
	Why   string
	// Aside counts the profile's layers kept aside because the bundle's
	// image changed (never merged, never deleted).
	Aside int
}

// ListUserlands says, for each profile in dataDir that has started a kvm
// guest with a bundle, which userland its next guest will use (Host's
// Userlands on this machine); none when there is no profiles directory.
func ListUserlands(dataDir string) ([]Userland, error) {
	profiles, err := openProfiles(dataDir)
	if profiles == nil || err != nil {
		return nil, err
	}
	defer profiles.Close()
	names, err := profileNames(profiles)
	var out []Userland
	for _, name := range names {
		u := Userland{Profile: name}
		layers, lerr := profiles.OpenDir(filepath.Join(name, vm.BundleLayersDir))
		if errors.Is(lerr, fs.ErrNotExist) {
			continue
		}
		if lerr != nil {
			u.Why = "the profile's bundle layers: " + noFollowErr(lerr).Error()
			out = append(out, u)
			continue
		}
		u.describe(layers)
		layers.Close()
		out = append(out, u)
	}
	return out, err
}

// describe fills u from the profile's layer directory.
func (u *Userland) describe(layers *beneath.Dir) {
	entries, _ := layers.Entries(maxProfiles)
	for _, e := range entries {
		if strings.HasSuffix(e.Name, ".old") {
			u.Aside++
		}
	}
	raw, err := layers.ReadFile(vm.BundleSourceFile, vm.MaxBundleSource)
	if err != nil {
		u.Why = "the host's system directories: the client has passed no bundle yet"
		return
	}
	u.Bundle = string(raw)
	ok, why := vm.DescribeBundle(u.Bundle)
	u.Image = ok
	if ok {
		u.Why = "the bundle's image " + why
		return
	}
	u.Why = "the host's system directories: the bundle cannot be booted: " + why
}

// userlandCheck lists which userland each profile's kvm guest will use.
// It never fails: without a bundle the guest uses the host's directories.
func (r *runner) userlandCheck() {
	c := Check{ID: CheckUserland, Group: GroupCoworkVMM, Title: "Guest userland (kvm backend)", Status: StatusOK}
	defer func() { r.add(c) }()
	dir, err := r.h.DataDir()
	if err != nil {
		c.Status, c.Detail = StatusSkip, "no data directory: "+err.Error()
		return
	}
	lands, err := r.h.Userlands(dir)
	if err != nil {
		c.Status, c.Detail = StatusWarn, fmt.Sprintf("cannot look at the profiles in %s: %v", dir, err)
		return
	}
	if len(lands) == 0 {
		c.Detail = "no profile has started on a bundle yet: a guest boots the client's bundle image (startVM's bundlePath) " +
			"when it can, else the host's system directories"
		return
	}
	parts := make([]string, 0, len(lands))
	for _, u := range lands {
		p := u.Profile + ": " + u.Why
		if u.Aside > 0 {
			p += fmt.Sprintf(" (%d layer(s) over an older image kept aside)", u.Aside)
		}
		if !u.Image && u.Bundle != "" {
			c.Status = StatusWarn
			c.Fix = "check the bundle directory the client passes (its rootfs.img); the guest falls back to the host's system directories meanwhile"
		}
		parts = append(parts, p)
	}
	c.Detail = strings.Join(parts, "; ")
}
