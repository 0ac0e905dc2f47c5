package bundle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/internal/cachedir"
)

// DirEnv names a bundle directory to use instead of the cache's current
// one.
const DirEnv = "COWORK_VMM_BUNDLE"

// What scripts/make-bundle.sh puts in a bundle; TestBuiltBundleLayout checks
// a built one against these.
const (
	RootImage = "rootfs.img" // the GPT disk
	DataImage = "data.img"   // a bare ext4 filesystem
	InfoFile  = "bundle.txt" // what was built, from what; written last

	RootLabel = "cloudimg-rootfs" // partition 1's ext4 label, as the client's
	ESPLabel  = "UEFI"            // partition 15's vfat label
	DataLabel = "cowork-data"     // data.img's ext4 label
	// DataMountPoint is where the root's /etc/fstab mounts data.img.
	DataMountPoint = "/opt/cowork-data"

	RootPartition = 1
	BIOSPartition = 14
	ESPPartition  = 15
	// Their GPT type GUIDs, as sfdisk prints them.
	TypeLinuxFilesystem = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
	TypeBIOSBoot        = "21686148-6449-6E6F-744E-656564454649"
	TypeEFISystem       = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"

	// MarkerPath in the root image holds Marker and a newline.
	MarkerPath = "/etc/cowork-bundle-marker"
	Marker     = "cowork-vmm stand-in bundle"
	// ToolPath in the root image prints ToolOutput.
	ToolPath   = "/usr/local/bin/cowork-bundle-tool"
	ToolOutput = "cowork-bundle-tool: running from the stand-in bundle\n" + Marker + "\n"
	// PythonModule, in python3's dist-packages, defines MARKER = Marker.
	PythonModule = "cowork_bundle"
	// Hostname is the root image's /etc/hostname, without the newline.
	Hostname = "cowork-bundle"
	// User is the root image's normal user, with UserID as uid and gid.
	User   = "cowork"
	UserID = 1000

	// DataMarkerPath in data.img (so DataMountPoint+DataMarkerPath in the
	// guest) holds DataMarker and a newline.
	DataMarkerPath = "/cowork-data-marker"
	DataMarker     = "cowork-vmm stand-in data image"
)

// Bundle is a built stand-in bundle: the directory a client would pass as
// bundlePath.
type Bundle struct {
	Dir string
}

// RootImagePath is the GPT disk's path.
func (b Bundle) RootImagePath() string { return filepath.Join(b.Dir, RootImage) }

// DataImagePath is the data image's path.
func (b Bundle) DataImagePath() string { return filepath.Join(b.Dir, DataImage) }

// DefaultDir is the bundle directory Find looks at: DirEnv, else
// scripts/make-bundle.sh's current build in the user's cache.
func DefaultDir() (string, error) { return cachedir.Dir(DirEnv, "bundles", "current") }

// Find returns the built bundle, or an error that says how to build it.
func Find() (Bundle, error) {
	dir, err := DefaultDir()
	if err != nil {
		return Bundle{}, fmt.Errorf("bundle: no cache directory: %w", err)
	}
	b := Bundle{Dir: dir}
	// The info file is written last: without it the build did not finish.
	for _, name := range []string{InfoFile, RootImage, DataImage} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return Bundle{}, fmt.Errorf("the stand-in bundle is not built (make bundle, which .ci/run runs, needs root and mmdebstrap): %w", err)
		}
		if !fi.Mode().IsRegular() || fi.Size() == 0 {
			return Bundle{}, errors.New("bundle: " + filepath.Join(dir, name) + " is not a non-empty regular file")
		}
	}
	return b, nil
}

// Require returns the built bundle, or skips tb saying why there is none.
func Require(tb testing.TB) Bundle {
	tb.Helper()
	b, err := Find()
	if err != nil {
		tb.Skip(err.Error())
	}
	return b
}
