package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"github.com/cowork-vmm/cowork-vmm/testharness/bundle"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// TestKVMBundleUserland: with bundlePath at the stand-in bundle
// (scripts/make-bundle.sh), the guest's userland is the bundle's root
// image (issue #41): a session runs the image's own tool and reads its
// marker (the host has neither), and sees the data image where the
// image's fstab mounts it; a file written to /usr/local as root (sudo)
// and a local .deb installed with sudo apt-get (where the image has apt)
// are there after stopVM and startVM, kept in the profile's layer; a
// second profile sees neither; a session's /tmp is on the image's disk;
// the image's bytes are unchanged.
// TestNestedKVMBundle runs it where this KVM cannot boot Linux.
func TestKVMBundleUserland(t *testing.T) {
	backend := kvmBackend(t, "TestNestedKVMBundle")
	b := bundle.Require(t)
	for _, p := range []string{bundle.ToolPath, bundle.MarkerPath} {
		if _, err := os.Stat(p); err == nil {
			t.Skipf("the host has %s: the test could not tell the image's userland from the host's", p)
		}
	}
	// On a read-only file system (the nested harness's share of the
	// bundle) nothing can write the image; its wrapper hashes it outside,
	// natively, instead of 1.1 GB read twice through the emulated share.
	readOnly := onReadOnlyFS(t, b.RootImagePath())
	var before string
	if !readOnly {
		before = sha256File(t, b.RootImagePath())
	}
	h := startHelper(t, backend)
	a := profilePipe(t, h.socket, "bundle-A")
	evA := subscribeProfile(t, h.socket, "bundle-A")
	started := time.Now()
	bootBundle(t, a, "bundle-A", b.Dir)
	t.Logf("bundle: startVM to connected, fresh layer: %v", time.Since(started))

	a.call("spawn", map[string]any{"id": "look", "name": "w", "command": "/bin/sh", "args": sh(`set -e
` + bundle.ToolPath + `
cat ` + bundle.MarkerPath + `
cat ` + bundle.DataMountPoint + bundle.DataMarkerPath + `
python3 -c 'import ` + bundle.PythonModule + ` as m; print("python module: " + m.MARKER)'
echo "node path: $NODE_PATH"
echo written-by-a | sudo tee /usr/local/share/cowork-bundle-written >/dev/null
if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
cd /sessions/w
` + makeDeb + `
DEBIAN_FRONTEND=noninteractive sudo apt-get install -y ./coworkdeb_1.0_all.deb > apt.log 2>&1 && echo apt-installed || { echo apt-failed; tail -n 30 apt.log >&2; }
else echo apt-absent; fi
echo done`)}, nil)
	exit, err := evA.tryWait("exit of look", 4*time.Minute, func(ev protocol.Event) bool { return ev.Type == protocol.EventExit && ev.ID == "look" })
	require.NoError(t, err)
	out := evA.output("stdout", "look")
	require.Contains(t, out, "done", "exit %+v, stderr %q", exit, evA.output("stderr", "look"))
	assert.Contains(t, out, bundle.ToolOutput, "the image's own tool ran")
	assert.Contains(t, out, bundle.Marker+"\n", "the image's /etc")
	assert.Contains(t, out, bundle.DataMarker, "the data image, mounted where the image's fstab says")
	assert.Contains(t, out, "python module: "+bundle.Marker+"\n", "the image's python finds its dist-packages")
	assert.Contains(t, out, "node path: /usr/local/lib/node_modules:/usr/lib/node_modules\n", "node finds npm's global modules")
	require.NotContains(t, out, "apt-failed", "sudo apt-get install of a local .deb; stderr %q", evA.output("stderr", "look"))
	withApt := strings.Contains(out, "apt-installed")
	if !withApt {
		t.Log("no apt-get or dpkg-deb in the bundle's image: the .deb part is not checked")
	}

	checkSessionTmpOnDisk(t, a, evA)
	a.call("stopVM", nil, nil)
	started = time.Now()
	a.call("startVM", map[string]any{"bundlePath": b.Dir, "memoryGB": 1.0, "cpuCount": 1}, nil)
	waitConnected(t, a)
	t.Logf("bundle: startVM to connected, again: %v", time.Since(started))
	check, want := `cat /usr/local/share/cowork-bundle-written`, "written-by-a\n"
	if withApt {
		check += `; dpkg-query -W -f='${Status}\n' coworkdeb; cat /opt/coworkdeb/hello`
		want += "install ok installed\nfrom-deb\n"
	}
	a.call("spawn", map[string]any{"id": "after", "name": "other", "command": "/bin/sh", "args": sh(check)}, nil)
	evA.exit("after")
	assert.Equal(t, want, evA.output("stdout", "after"), "kept across stopVM/startVM; stderr %q", evA.output("stderr", "after"))
	a.call("stopVM", nil, nil)

	c := profilePipe(t, h.socket, "bundle-B")
	evB := subscribeProfile(t, h.socket, "bundle-B")
	bootBundle(t, c, "bundle-B", b.Dir)
	c.call("spawn", map[string]any{"id": "other", "name": "w", "command": "/bin/sh",
		"args": sh(`cat ` + bundle.MarkerPath + `; test -e /usr/local/share/cowork-bundle-written && echo seen || echo absent
dpkg-query -W coworkdeb >/dev/null 2>&1 && echo seen || echo absent`)}, nil)
	evB.exit("other")
	assert.Equal(t, bundle.Marker+"\nabsent\nabsent\n", evB.output("stdout", "other"), "another profile's layer is its own")
	c.call("stopVM", nil, nil)

	if !readOnly {
		assert.Equal(t, before, sha256File(t, b.RootImagePath()), "the bundle's image is never written")
	}
	assert.Contains(t, h.stderr.String(), "booting the client's VM bundle")
	recordBoot(t)
}

// bootBundle configures profile name and starts its guest on the bundle
// at dir.
func bootBundle(t *testing.T, c *client, name, dir string) {
	t.Helper()
	c.call("configure", map[string]any{"userDataName": name, "userDataRoot": contractRoot, "networkDrives": []any{}, "memoryMB": 1024, "cpuCount": 1}, nil)
	c.call("startVM", map[string]any{"bundlePath": dir, "memoryGB": 1.0, "cpuCount": 1}, nil)
	waitConnected(t, c)
}

// onReadOnlyFS says whether path lies on a file system mounted read-only.
func onReadOnlyFS(t *testing.T, path string) bool {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(path, &st))
	return st.Flags&unix.ST_RDONLY != 0
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// TestNestedKVMBundle runs TestKVMBundleUserland and
// TestKVMBundleFigures (whose figures it records) inside the nested
// harness (see TestNestedKVMClientFlow), the stand-in bundle's directory
// shared into the outer guest (read-only: its /root is a fresh tmpfs).
// It skips without the bundle.
func TestNestedKVMBundle(t *testing.T) {
	b := bundle.Require(t)
	dir, err := filepath.EvalSymlinks(b.Dir)
	require.NoError(t, err)
	before := sha256File(t, b.RootImagePath())
	env := []string{bundle.DirEnv + "=" + dir}
	if n := os.Getenv(benchTreeFilesEnv); n != "" {
		env = append(env, benchTreeFilesEnv+"="+n)
	}
	gt := nestedKVMTest(t, "^(TestKVMBundleUserland|TestKVMBundleFigures)$", 40*time.Minute, 1, env...)
	gt.Shares = []string{dir}
	res := nested.RunGoTestWith(t, gt)
	figures := nested.FiguresIn(res.Output, bundleFiguresMarker)
	if len(figures) == 0 {
		t.Error("the bundle figures measured nothing inside the nested guest (skipped there?)")
	}
	nested.RecordFigures(t, figures...)
	assert.Equal(t, before, sha256File(t, filepath.Join(dir, bundle.RootImage)), "the bundle's image is never written")
}
