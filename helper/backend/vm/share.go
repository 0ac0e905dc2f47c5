package vm

import (
	"fmt"
	"log/slog"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
	"github.com/cowork-vmm/cowork-vmm/devices/p9"
	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
	"github.com/cowork-vmm/cowork-vmm/devices/virtiofs"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// FSEnv selects the device type the guest's host shares go through
// (Options.FileSharing): FileSharingVirtioFS (the default) or
// FileSharingNineP.
const FSEnv = "COWORK_VMM_FS"

// Values of Options.FileSharing (and FSEnv).
const (
	// FileSharingVirtioFS: virtio-fs devices (devices/virtiofs), the
	// default (also for an empty value).
	FileSharingVirtioFS = "virtiofs"
	// FileSharingNineP: virtio-9p devices (devices/p9), the fallback.
	FileSharingNineP = "9p"
)

// FileSharingKind returns the protocol.MountKind of the devices a
// FileSharing value selects; any other value than "", FileSharingVirtioFS
// and FileSharingNineP is an error naming FSEnv.
func FileSharingKind(value string) (string, error) {
	switch value {
	case "", FileSharingVirtioFS:
		return protocol.MountKindVirtioFS, nil
	case FileSharingNineP:
		return protocol.MountKindNineP, nil
	}
	return "", fmt.Errorf("kvm backend: %s=%q names no file-sharing device: use %q (the default) or %q", FSEnv, value, FileSharingVirtioFS, FileSharingNineP)
}

// ShareDevice is one file-sharing device of a VM: the exports it serves
// (for the backend, an attach name "e<n>" per shared host path), the
// virtio device serving them — virtio-fs or virtio-9p, over the same
// export layer (devices/hostfs) — and what every export of it is mounted
// from. The backend's guests and the file-sharing benchmark
// (testharness/guestboot/fsrun) both make theirs with NewShareDevice.
type ShareDevice struct {
	exports *hostfs.Exports
	// descriptors is the device's share of the helper-wide descriptor
	// budget, which every host descriptor its exports hold comes from.
	descriptors *fdlimit.Share
	dev         interface{ Close() } // nil in tests without a VM
	// source is the MountSource of its exports without the Aname: the
	// kind, the tag and, for 9p, the guest's cache mode.
	source protocol.MountSource
	// cached: the guest caches its files for good, so a file is shared
	// as an immutable export (see add).
	cached bool
}

// NewShareDevice makes the device of kind (protocol.MountKindVirtioFS or
// MountKindNineP) with this tag over a fresh set of exports, its files
// cached by the guest if cached is set, holding the host descriptors
// descriptors allows (the device's share of the helper-wide budget, which
// it owns from now on). The returned virtio.Device is to be attached; on
// error nothing is left to release.
func NewShareDevice(kind, tag string, cached bool, descriptors *fdlimit.Share, log *slog.Logger) (*ShareDevice, virtio.Device, error) {
	exports := hostfs.NewExportsWithin(log, descriptors)
	var dev interface {
		virtio.Device
		Close()
	}
	var err error
	s := &ShareDevice{exports: exports, descriptors: descriptors, source: protocol.MountSource{Kind: kind, Tag: tag}, cached: cached}
	switch kind {
	case protocol.MountKindVirtioFS:
		// The cached device serves only read-only exports (ShareSystem),
		// so its guest may open files without asking (NoOpen); they are
		// the system directories, listed by programs' module searches far
		// more than stat'ed entry by entry (ListNamesOnly).
		dev, err = virtiofs.New(virtiofs.Options{Tag: tag, Root: exports, Cached: cached, NoOpen: cached, ListNamesOnly: cached,
			Logger: log})
	case protocol.MountKindNineP:
		if cached {
			s.source.Cache = protocol.NinePCacheLoose
		}
		dev, err = p9.New(p9.Options{Tag: tag, Attacher: p9.ExportsAttacher(exports), Logger: log})
	default:
		err = fmt.Errorf("no file-sharing device of kind %q", kind)
	}
	if err != nil {
		exports.Close()
		descriptors.Close()
		return nil, nil, fmt.Errorf("creating the %s device %q: %w", kind, tag, err)
	}
	s.dev = dev
	return s, dev, nil
}

// add registers hostPath, a directory or (regular) a file, under name.
// A file is a single-file export: on a cached device an immutable one
// (hostfs.Exports.AddImmutableFile, read-only), pinned to the inode
// shared, since the guest keeps its pages across opens and would mix
// them with a file the host put at that name later; on the uncached
// device one that follows its name (an editor's save shows), served as
// opts say.
func (s *ShareDevice) add(name, hostPath string, regular, readOnly bool, opts ...hostfs.Option) error {
	switch {
	case !regular:
		return s.exports.Add(name, hostPath, readOnly, opts...)
	case s.cached:
		return s.exports.AddImmutableFile(name, hostPath)
	}
	return s.exports.AddFile(name, hostPath, readOnly, opts...)
}

// Exports are the host paths the device serves, by attach name.
func (s *ShareDevice) Exports() *hostfs.Exports { return s.exports }

// Close releases the device, then its exports and its descriptor share;
// call it after the machine's reset, so that what the guest still held is
// answered or dropped first.
func (s *ShareDevice) Close() {
	if s.dev != nil {
		s.dev.Close()
	}
	s.exports.Close()
	s.descriptors.Close()
}
