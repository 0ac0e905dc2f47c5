package guesthost_test

import (
	"go/build"
	"path/filepath"
	"slices"
	"testing"
)

const module = "github.com/cowork-vmm/cowork-vmm/"

// imports returns the packages the non-test files of the module's package
// rel import.
func imports(t *testing.T, rel string) []string {
	t.Helper()
	p, err := build.ImportDir(filepath.Join("..", "..", rel), 0)
	if err != nil {
		t.Fatalf("reading %s: %v", rel, err)
	}
	return p.Imports
}

// TestContractImports: guesthost is a leaf, and each side takes the
// contract from it rather than from the other side's packages: the agent
// does not import a device for a port, the guest proxy does not import the
// helper's egress server for a word, and the devices do not import the
// protocol package (sockets, servers) for a constant.
func TestContractImports(t *testing.T) {
	if got := imports(t, "protocol/guesthost"); len(got) != 0 {
		t.Errorf("guesthost imports %v: it must import nothing", got)
	}
	for _, c := range []struct{ pkg, forbidden string }{
		{"guest/agent", "devices/platform"},
		{"guest/proxy", "egress"},
		{"devices/platform", "protocol"},
		{"devices/platform", "helper"},
	} {
		if slices.Contains(imports(t, c.pkg), module+c.forbidden) {
			t.Errorf("%s imports %s", c.pkg, c.forbidden)
		}
	}
}
