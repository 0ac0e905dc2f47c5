package agent

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// FuzzMountParams feeds arbitrary mount request params through decoding and
// validation: never a panic, and whatever is accepted is a clean absolute
// target outside the agent's reserved paths, with a safe source.
func FuzzMountParams(f *testing.F) {
	f.Add([]byte(`{"mount":{"source":{"kind":"bind","path":"/home/u/p"},"target":"/sessions/s/mnt/p","readOnly":true}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"9p","tag":"cowork","aname":"s1-home"},"target":"/sessions/s1"}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"bind","path":"/sdk/1.0"},"sourceFile":"claude","target":"/usr/local/bin/claude"}}`))
	f.Add([]byte(`{"mount":{"source":{"kind":"tmpfs"},"target":"/.host/x"}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var p protocol.MountParams
		if decodeParams(raw, &p) != nil {
			return
		}
		mt := p.Mount
		if validateMount(mt) != nil {
			return
		}
		if !filepath.IsAbs(mt.Target) || filepath.Clean(mt.Target) != mt.Target || mt.Target == "/" {
			t.Fatalf("accepted target %q", mt.Target)
		}
		for _, reserved := range []string{hostRootDir, stagingDir} {
			if mt.Target == reserved || strings.HasPrefix(mt.Target, reserved+"/") {
				t.Fatalf("accepted reserved target %q", mt.Target)
			}
		}
		if strings.Contains(mt.SourceFile, "..") && strings.Split(mt.SourceFile, "/")[0] == ".." {
			t.Fatalf("accepted escaping sourceFile %q", mt.SourceFile)
		}
		if mt.Source.Kind == "9p" && (strings.ContainsAny(mt.Source.Tag+mt.Source.Aname, ",\x00") || strings.ContainsRune(mt.Source.Aname, '/') || mt.Source.Aname == "..") {
			t.Fatalf("accepted 9p option injection %+v", mt.Source)
		}
		if _, err := json.Marshal(mt); err != nil {
			t.Fatal(err)
		}
	})
}
