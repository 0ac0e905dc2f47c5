package bundle

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
)

// RootLabel is the ext4 label of the client's root partition (Ubuntu cloud
// images'), the first rule of root selection.
const RootLabel = "cloudimg-rootfs"

// ErrNoExt4 says an image has no usable ext4 filesystem to boot.
var ErrNoExt4 = errors.New("no ext4 partition")

// Root is the volume of an image the guest boots as its userland.
type Root struct {
	// Image is the image's path.
	Image string
	Volume
	// Reason says why this volume was chosen, for the log and doctor:
	// which rule matched, and what was skipped on the way.
	Reason string
}

// SelectRoot chooses the root volume of img: the ext4 filesystem labelled
// RootLabel (the first, if several are), else the ext4 partition of GPT
// type Linux root for this architecture (nativeRoot), else the largest ext4 volume (the first of equal
// ones). An image without a partition table is its own root. Partitions
// whose superblock is invalid take no part; the reason lists them, and
// the table's notes (a primary GPT replaced by its backup).
func SelectRoot(img Image) (Root, error) {
	name := filepath.Base(img.Path)
	if len(img.Volumes) == 0 {
		return Root{}, noExt4Error(img)
	}
	v, why := chooseRoot(img.Volumes, nativeRoot)
	reason := fmt.Sprintf("%s of %s: %s", v.Describe(), name, why)
	if v.FS.NeedsRecovery {
		reason += "; its journal needs recovery"
	}
	if len(img.Problems) > 0 {
		reason += "; skipped " + strings.Join(img.Problems, "; ")
	}
	if len(img.Table.Notes) > 0 {
		reason += "; " + strings.Join(img.Table.Notes, "; ")
	}
	return Root{Image: img.Path, Volume: v, Reason: reason}, nil
}

// chooseRoot applies the three rules to vols (not empty), with rootType the
// Linux root partition type of the guest's architecture, and says which
// one chose.
func chooseRoot(vols []Volume, rootType GUID) (Volume, string) {
	var labelled []Volume
	for _, v := range vols {
		if v.FS.Label == RootLabel {
			labelled = append(labelled, v)
		}
	}
	switch {
	case len(labelled) == 1:
		return labelled[0], fmt.Sprintf("ext4 labelled %q", RootLabel)
	case len(labelled) > 1:
		return labelled[0], fmt.Sprintf("ext4 labelled %q, the first of %d so labelled", RootLabel, len(labelled))
	}
	if vols[0].Partition.Number == 0 {
		return vols[0], fmt.Sprintf("the image has no partition table and is one ext4 filesystem (label %q)", vols[0].FS.Label)
	}
	for _, v := range vols {
		if v.Partition.Type == rootType {
			return v, fmt.Sprintf("no ext4 labelled %q; partition type %s", RootLabel, guidNames[rootType])
		}
	}
	largest := vols[0]
	for _, v := range vols[1:] {
		if v.Length() > largest.Length() {
			largest = v
		}
	}
	return largest, fmt.Sprintf("no ext4 labelled %q nor of type %s; the largest of %d ext4 partitions (%d bytes, label %q)",
		RootLabel, guidNames[rootType], len(vols), largest.Length(), largest.FS.Label)
}

// How reasons name the Linux root types.
const (
	LinuxRootX86_64Name = "Linux root (x86-64)"
	LinuxRootARM64Name  = "Linux root (ARM-64)"
)

// nativeRoot is the Linux root partition type of the guest this helper
// boots: its own architecture's (Discoverable Partitions Specification).
var nativeRoot = map[string]GUID{"amd64": LinuxRootX86_64, "arm64": LinuxRootARM64}[runtime.GOARCH]

// noExt4Error says why img has no root: which table, which partitions,
// what was wrong with them.
func noExt4Error(img Image) error {
	var parts []string
	for _, p := range img.Table.Partitions {
		parts = append(parts, fmt.Sprintf("%d (%s)", p.Number, p.TypeName()))
	}
	detail := fmt.Sprintf("%s table", img.Table.Kind)
	if img.Table.Kind == TableNone {
		detail = "no partition table"
	}
	if len(parts) > 0 {
		detail += " with partitions " + strings.Join(parts, ", ")
	}
	if len(img.Problems) > 0 {
		detail += "; " + strings.Join(img.Problems, "; ")
	}
	return fmt.Errorf("%s: %w (%s)", img.Path, ErrNoExt4, detail)
}

// LogValue makes a Root one slog group: image, partition, offset, length,
// label, uuid, needsRecovery and reason.
func (r Root) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("image", r.Image),
		slog.Int("partition", r.Partition.Number),
		slog.Int64("offset", r.Offset()),
		slog.Int64("length", r.Length()),
		slog.String("label", r.FS.Label),
		slog.String("uuid", r.FS.UUID),
		slog.Bool("needsRecovery", r.FS.NeedsRecovery),
		slog.String("reason", r.Reason),
	)
}
