package vm

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	ninep "github.com/cowork-vmm/cowork-vmm/devices/p9"
	"github.com/cowork-vmm/cowork-vmm/devices/virtiofs"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// Issue #15: a file is shared as a single-file export, never as its
// directory; Unshare withdraws an export and revokes what the guest holds.
func TestShareOfAFileExportsOnlyThatFile(t *testing.T) {
	g := testGuest(t)
	home := t.TempDir()
	for name, content := range map[string]string{".gitconfig": "[user]", "secret": "s"} {
		if err := os.WriteFile(filepath.Join(home, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src, err := g.Share(filepath.Join(home, ".gitconfig"), false)
	if err != nil {
		t.Fatal(err)
	}
	root, err := ninep.ExportsAttacher(g.files.exports).Attach()
	if err != nil {
		t.Fatal(err)
	}
	_, view, err := root.Walk([]string{src.Aname})
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	if _, _, err := view.Walk([]string{"secret"}); err != linux.ENOENT {
		t.Errorf("walk to a neighbour of the shared file: %v, want ENOENT", err)
	}
	_, f, err := view.Walk([]string{".gitconfig"})
	if err != nil {
		t.Fatalf("walk to the shared file (the agent's SourceFile): %v", err)
	}
	defer f.Close()
	if _, _, err := f.Open(p9.ReadWrite); err != nil {
		t.Fatal(err)
	}

	g.Unshare(src)
	if names := g.files.exports.Names(); slices.Contains(names, src.Aname) {
		t.Errorf("exports after Unshare: %v", names)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err != linux.ESTALE {
		t.Errorf("write through a held file after Unshare: %v, want ESTALE", err)
	}
	g.Unshare(src)                                                              // again: no-op
	g.Unshare(protocol.MountSource{Kind: "bind", Path: home})                   // not ours: no-op
	g.Unshare(protocol.MountSource{Kind: "9p", Tag: "other", Aname: src.Aname}) // no such device
}

func TestUnshareOfASystemExport(t *testing.T) {
	g := testGuest(t)
	src, err := g.ShareSystem(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := g.Share(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	g.Unshare(src)
	if names := g.sysFiles.exports.Names(); len(names) != 0 {
		t.Errorf("system exports after Unshare: %v", names)
	}
	if names := g.files.exports.Names(); !slices.Equal(names, []string{other.Aname}) {
		t.Errorf("exports %v: Unshare of a system export touched the other device", names)
	}
	var noDevice guest
	noDevice.Unshare(src) // no device: no-op
}

func TestFileSharingKind(t *testing.T) {
	for value, want := range map[string]string{
		"": protocol.MountKindVirtioFS, FileSharingVirtioFS: protocol.MountKindVirtioFS, FileSharingNineP: protocol.MountKindNineP,
	} {
		if got, err := FileSharingKind(value); err != nil || got != want {
			t.Errorf("FileSharingKind(%q) = %q, %v; want %q", value, got, err, want)
		}
	}
	for _, value := range []string{"virtio-fs", "VIRTIOFS", "9P", " 9p", "p9", "nfs", "bind"} {
		_, err := FileSharingKind(value)
		if err == nil {
			t.Errorf("FileSharingKind(%q) accepted", value)
			continue
		}
		for _, want := range []string{FSEnv, `"` + value + `"`, `"virtiofs"`, `"9p"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("FileSharingKind(%q): error %q does not name %s", value, err, want)
			}
		}
	}
}

// An unknown COWORK_VMM_FS fails startVM at once, naming the variable and
// what it accepts, before the host is even probed.
func TestStartRefusesAnUnknownFileSharing(t *testing.T) {
	b := New(Options{Logger: quiet(), FileSharing: "virtio-9p"})
	probed := false
	b.probe = func(string) kvm.HostProbe { probed = true; return probeFacts(false, nil) }
	var steps []string
	_, err := b.Start(context.Background(), helper.GuestConfig{StepFunc: func(s, st string) { steps = append(steps, s+":"+st) }})
	if err == nil || !strings.Contains(err.Error(), "COWORK_VMM_FS=\"virtio-9p\"") || !strings.Contains(err.Error(), `"virtiofs" (the default) or "9p"`) {
		t.Fatalf("Start with COWORK_VMM_FS=virtio-9p: %v, want an error naming the variable and the accepted values", err)
	}
	if probed || len(steps) != 0 {
		t.Errorf("Start probed the host (%v) or reported steps %v before refusing its options", probed, steps)
	}
}

// With COWORK_VMM_FS=9p the same shares go to virtio-9p devices: the
// system device's sources carry the loose cache mode, Share's none, and
// Unshare matches the kind as well as the tag.
func TestSharesOnNinePDevices(t *testing.T) {
	kind, err := FileSharingKind(FileSharingNineP)
	if err != nil {
		t.Fatal(err)
	}
	g := testGuestOf(t, kind)
	sys, err := g.ShareSystem(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if want := (protocol.MountSource{Kind: protocol.MountKindNineP, Tag: SystemMountTag, Aname: sys.Aname, Cache: protocol.NinePCacheLoose}); sys != want {
		t.Errorf("ShareSystem: %+v, want %+v", sys, want)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "f")} {
		src, err := g.Share(p, false)
		if err != nil {
			t.Fatal(err)
		}
		if want := (protocol.MountSource{Kind: protocol.MountKindNineP, Tag: MountTag, Aname: src.Aname}); src != want || src.Aname == sys.Aname {
			t.Errorf("Share(%s): %+v, want %+v with its own aname", p, src, want)
		}
	}
	if _, ok := g.files.dev.(*ninep.Device); !ok {
		t.Errorf("the uncached device is a %T, want a *p9.Device", g.files.dev)
	}

	other := sys
	other.Kind = protocol.MountKindVirtioFS
	g.Unshare(other) // a virtio-fs source: not this VM's device
	if names := g.sysFiles.exports.Names(); !slices.Equal(names, []string{sys.Aname}) {
		t.Errorf("system exports %v after the Unshare of another kind's source, want [%s]", names, sys.Aname)
	}
	g.Unshare(sys)
	if names := g.sysFiles.exports.Names(); len(names) != 0 {
		t.Errorf("system exports after Unshare: %v", names)
	}
}

// By default the devices are virtio-fs ones, the system device cached.
func TestDefaultSharesOnVirtioFSDevices(t *testing.T) {
	g := testGuest(t)
	for _, d := range []*ShareDevice{g.files, g.sysFiles} {
		if _, ok := d.dev.(*virtiofs.Device); !ok || d.source.Kind != protocol.MountKindVirtioFS || d.source.Cache != "" {
			t.Errorf("device %q: a %T with sources %+v, want a *virtiofs.Device with virtiofs sources and no cache mode", d.source.Tag, d.dev, d.source)
		}
	}
	src, err := g.Share(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	other := src
	other.Kind = protocol.MountKindNineP
	g.Unshare(other) // a 9p source: not this VM's device
	if names := g.files.exports.Names(); !slices.Equal(names, []string{src.Aname}) {
		t.Errorf("exports %v after the Unshare of another kind's source, want [%s]", names, src.Aname)
	}
	if _, _, err := NewShareDevice("bind", MountTag, false, fdlimit.NewPool(0).Share(0), quiet()); err == nil {
		t.Error("a share device of kind bind was made")
	}
}

// Issue #39: every VM's file-sharing devices draw from the one pool the
// helper hands its backends; a second VM's devices each get less than
// the first VM's had, the parts never add up past the pool's total, and
// a stopped VM's part goes back to the others.
func TestShareDevicesDrawFromOneHelperWidePool(t *testing.T) {
	pool := fdlimit.NewPool(8192)
	b := New(Options{Descriptors: pool})
	if b.opts.Descriptors != pool {
		t.Fatal("the backend does not use the helper's pool")
	}
	vm := func() []*ShareDevice {
		var devs []*ShareDevice
		for _, tag := range []string{MountTag, SystemMountTag} {
			s, _, err := NewShareDevice(protocol.MountKindVirtioFS, tag, tag == SystemMountTag, pool.Share(0), quiet())
			if err != nil {
				t.Fatal(err)
			}
			devs = append(devs, s)
		}
		return devs
	}
	first := vm()
	alone := first[0].descriptors.Limit()
	second := vm()
	each := second[0].descriptors.Limit()
	if each >= alone || 4*each > pool.Total() {
		t.Errorf("with two VMs each device may hold %d (alone %d, total %d)", each, alone, pool.Total())
	}
	for _, s := range second {
		s.Close()
	}
	if got := first[0].descriptors.Limit(); got != alone {
		t.Errorf("after the second VM stopped the first's device may hold %d, want %d", got, alone)
	}
	for _, s := range first {
		s.Close()
	}
}

// Issue #42: a file shared through ShareSystem (the installed SDK binary)
// goes to the cached system device as an immutable single-file export,
// on either kind of device: replaced on the host (a re-download renamed
// over it), the export still serves the file it was shared with, which
// the guest caches for good; Unshare withdraws it. Share's file exports
// follow the name instead (TestShareOfAFileExportsOnlyThatFile).
func TestShareSystemOfAFileIsImmutable(t *testing.T) {
	for _, fs := range []string{FileSharingVirtioFS, FileSharingNineP} {
		t.Run(fs, func(t *testing.T) {
			kind, err := FileSharingKind(fs)
			if err != nil {
				t.Fatal(err)
			}
			g := testGuestOf(t, kind)
			dir := filepath.Join(t.TempDir(), "1.0.0")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "claude")
			if err := os.WriteFile(path, []byte("as installed"), 0o755); err != nil {
				t.Fatal(err)
			}
			src, err := g.ShareSystem(path)
			if err != nil {
				t.Fatal(err)
			}
			if src.Tag != SystemMountTag || !slices.Equal(g.sysFiles.exports.Names(), []string{src.Aname}) {
				t.Fatalf("ShareSystem(%s): %+v, system exports %v", path, src, g.sysFiles.exports.Names())
			}
			root, err := ninep.ExportsAttacher(g.sysFiles.exports).Attach()
			if err != nil {
				t.Fatal(err)
			}
			_, view, err := root.Walk([]string{src.Aname})
			if err != nil {
				t.Fatal(err)
			}
			defer view.Close()
			_, f, err := view.Walk([]string{"claude"})
			if err != nil {
				t.Fatalf("walk to the shared file (the agent's SourceFile): %v", err)
			}
			defer f.Close()
			tmp := path + ".download"
			if err := os.WriteFile(tmp, []byte("re-downloaded, another file"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
			if _, _, err := f.Open(p9.ReadOnly); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			n, _ := f.ReadAt(buf, 0)
			if got := string(buf[:n]); got != "as installed" {
				t.Errorf("read after the host replaced the file: %q, want the file as shared", got)
			}
			g.Unshare(src)
			if _, err := f.ReadAt(buf, 0); err != linux.ESTALE {
				t.Errorf("read after Unshare: %v, want ESTALE", err)
			}
		})
	}
}
