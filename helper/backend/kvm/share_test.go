package kvm

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"

	"github.com/cowork-vmm/cowork-vmm/protocol"
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
	root, err := g.exports.Attach()
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
	if names := g.exports.Names(); slices.Contains(names, src.Aname) {
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
	if names := g.sysExports.Names(); len(names) != 0 {
		t.Errorf("system exports after Unshare: %v", names)
	}
	if names := g.exports.Names(); !slices.Equal(names, []string{other.Aname}) {
		t.Errorf("exports %v: Unshare of a system export touched the other device", names)
	}
	var noDevice guest
	noDevice.Unshare(src) // no device: no-op
}
