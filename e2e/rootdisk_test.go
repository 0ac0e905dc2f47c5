package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// makeWheel is a shell command that writes a minimal pure-Python wheel
// (package coworkroot, VALUE = 42) to /sessions/<session>/, with the
// guest's python3.
const makeWheel = `python3 - <<'PY'
import zipfile
files = {
    "coworkroot/__init__.py": "VALUE = 42\n",
    "coworkroot-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: coworkroot\nVersion: 1.0\n",
    "coworkroot-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: cowork-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
files["coworkroot-1.0.dist-info/RECORD"] = "".join(n + ",,\n" for n in list(files) + ["coworkroot-1.0.dist-info/RECORD"])
with zipfile.ZipFile("coworkroot-1.0-py3-none-any.whl", "w") as z:
    for name, body in files.items():
        z.writestr(name, body)
PY`

// makeDeb is a shell command that builds a minimal Debian package
// (coworkdeb, one file /opt/coworkdeb/hello) in the working directory,
// with the guest's dpkg-deb (the host's).
const makeDeb = `mkdir -p deb/DEBIAN deb/opt/coworkdeb
printf 'Package: coworkdeb\nVersion: 1.0\nArchitecture: all\nMaintainer: e2e <e2e@localhost>\nDescription: cowork-vmm e2e package\n' > deb/DEBIAN/control
echo from-deb > deb/opt/coworkdeb/hello
dpkg-deb --root-owner-group -b deb coworkdeb_1.0_all.deb >/dev/null`

// TestKVMContractWritableRoot: a session changes the guest's root — a
// file in /opt and in /usr/local, a wheel installed with pip from a
// local file into the system's site-packages (--target: left to itself pip asks access(2),
// which answers for the spawn's uid without its capabilities, finds the
// root-owned site-packages unwritable and installs into the session's home
// instead), and a local .deb installed with `sudo apt-get install` (the
// package database an overlay of the host's, on the disk's /var) — and
// the changes are there after stopVM and startVM, kept on the profile's
// root disk; a second profile's guest does not see them (issue #19).
// TestNestedKVMContract runs it where this KVM cannot boot Linux.
func TestKVMContractWritableRoot(t *testing.T) {
	backend := kvmBackend(t, "TestNestedKVMContract")
	if _, err := os.Stat("/opt"); err != nil {
		t.Skip("the host has no /opt to overlay")
	}
	h := startHelper(t, backend)
	a := profilePipe(t, h.socket, "root-A")
	evA := subscribeProfile(t, h.socket, "root-A")
	a.call("createVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "diskSizeGB": 1}, nil)
	started := time.Now()
	bootProfile(t, a, "root-A")
	t.Logf("boot with a blank root disk (formatted): %v", time.Since(started))
	disks, err := filepath.Glob(filepath.Join(h.dataDir, "cowork-vmm", "profiles", "root-A-*", "root.img"))
	require.NoError(t, err)
	require.Len(t, disks, 1, "the profile's root disk")
	st, err := os.Stat(disks[0])
	require.NoError(t, err)
	assert.Equal(t, int64(1<<30), st.Size(), "sized by createVM's diskSizeGB")

	a.call("spawn", map[string]any{"id": "change", "name": "w", "command": "/bin/sh", "args": sh(`set -e
cd /sessions/w
echo writing-opt
echo kept > /opt/cowork-root-test
echo writing-usr
mkdir -p /usr/local/share/cowork-root-test && echo usr > /usr/local/share/cowork-root-test/f
echo pip?
if python3 -m pip --version >/dev/null 2>&1; then
` + makeWheel + `
PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install --target "$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" --no-index --no-cache-dir --break-system-packages ./coworkroot-1.0-py3-none-any.whl > pip.log 2>&1 && echo pip-installed
cd / && python3 -c 'import coworkroot; print("installed in", coworkroot.__file__)' >&2
else echo pip-absent; fi
if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
cd /sessions/w
` + makeDeb + `
DEBIAN_FRONTEND=noninteractive sudo apt-get install -y ./coworkdeb_1.0_all.deb > apt.log 2>&1 && echo apt-installed || { echo apt-failed; tail -n 30 apt.log >&2; }
else echo apt-absent; fi
echo changed`)}, nil)
	// pip takes its time under emulation (the nested harness).
	exit, err := evA.tryWait("exit of change", 8*time.Minute, func(ev protocol.Event) bool { return ev.Type == protocol.EventExit && ev.ID == "change" })
	require.NoError(t, err)
	out := evA.output("stdout", "change")
	require.Contains(t, out, "changed", "the session changed the root: exit %+v, stderr %q", exit, evA.output("stderr", "change"))
	withPip := strings.Contains(out, "pip-installed")
	require.NotContains(t, out, "apt-failed", "sudo apt-get install of a local .deb; stderr %q", evA.output("stderr", "change"))
	withApt := strings.Contains(out, "apt-installed")
	if !withApt {
		t.Log("no apt-get or dpkg-deb on this host: the .deb part is not checked")
	}
	t.Logf("the change's stderr: %s", evA.output("stderr", "change"))
	if !withPip {
		t.Log("no pip on this host (python3-pip): the wheel part is not checked")
	}

	checkSessionTmpOnDisk(t, a, evA)
	a.call("stopVM", nil, nil)
	checkJournalEmpty(t, disks[0])
	a.call("startVM", map[string]any{"bundlePath": filepath.Join(t.TempDir(), "bundle"), "memoryGB": 1.0, "cpuCount": 1}, nil)
	started = time.Now()
	waitConnected(t, a)
	t.Logf("startVM to connected, the root disk formatted already: %v", time.Since(started))
	check := `cat /opt/cowork-root-test /usr/local/share/cowork-root-test/f`
	if withPip {
		check += `; python3 -c 'import coworkroot; print("wheel", coworkroot.VALUE)'`
	}
	if withApt {
		check += `; dpkg-query -W -f='${Status}\n' coworkdeb; cat /opt/coworkdeb/hello`
	}
	a.call("spawn", map[string]any{"id": "after", "name": "other", "command": "/bin/sh", "args": sh(check)}, nil)
	_, err = evA.tryWait("exit of after", 4*time.Minute, func(ev protocol.Event) bool { return ev.Type == protocol.EventExit && ev.ID == "after" })
	require.NoError(t, err)
	want := "kept\nusr\n"
	if withPip {
		want += "wheel 42\n"
	}
	if withApt {
		want += "install ok installed\nfrom-deb\n"
	}
	assert.Equal(t, want, evA.output("stdout", "after"), "after stopVM/startVM, in another session; stderr %q", evA.output("stderr", "after"))
	a.call("spawn", map[string]any{"id": "tmp-fresh", "name": "w", "command": "/bin/sh", "args": sh(`ls -A /tmp | wc -l`)}, nil)
	evA.exit("tmp-fresh")
	assert.Equal(t, "0\n", evA.output("stdout", "tmp-fresh"), "the session's /tmp starts empty at each start")

	a.call("stopVM", nil, nil)
	b := profilePipe(t, h.socket, "root-B")
	evB := subscribeProfile(t, h.socket, "root-B")
	bootProfile(t, b, "root-B")
	b.call("spawn", map[string]any{"id": "look", "name": "w", "command": "/bin/sh",
		"args": sh(`test -e /opt/cowork-root-test && echo seen || echo absent; test -e /usr/local/share/cowork-root-test && echo seen || echo absent
dpkg-query -W coworkdeb >/dev/null 2>&1 && echo seen || echo absent`)}, nil)
	evB.exit("look")
	assert.Equal(t, "absent\nabsent\nabsent\n", evB.output("stdout", "look"), "another profile's root is its own")
	b.call("stopVM", nil, nil)
	_, err = os.Stat("/opt/cowork-root-test")
	assert.ErrorIs(t, err, os.ErrNotExist, "the host's /opt was never written")
	recordBoot(t)
}

// checkSessionTmpOnDisk: a session's spawns share a /tmp on the root disk
// (not in guest RAM), which pruneSessionCaches with includeSessionTmp
// empties; /tmp/left is left there for the restart to clear.
func checkSessionTmpOnDisk(t *testing.T, c *client, ev *events) {
	const mib = 3
	c.call("spawn", map[string]any{"id": "tmp-write", "name": "w", "command": "/bin/sh",
		"args": sh(`stat -f -c %T /tmp; head -c ` + strconv.Itoa(mib<<20) + ` /dev/zero > /tmp/big && echo written`)}, nil)
	ev.exit("tmp-write")
	assert.Equal(t, "ext2/ext3\nwritten\n", ev.output("stdout", "tmp-write"), "/tmp is on the disk; stderr %q", ev.output("stderr", "tmp-write"))
	c.call("spawn", map[string]any{"id": "tmp-read", "name": "w", "command": "/bin/sh", "args": sh(`wc -c < /tmp/big`)}, nil)
	ev.exit("tmp-read")
	assert.Equal(t, strconv.Itoa(mib<<20)+"\n", ev.output("stdout", "tmp-read"), "the session's spawns share its /tmp")

	var pruned protocol.PruneResult
	c.call("pruneSessionCaches", map[string]any{"includeSessionTmp": true, "sessionTmpOlderThanSeconds": 0}, &pruned)
	assert.GreaterOrEqual(t, pruned.FreedBytes, int64(mib<<20), "the guest's /tmp pruned: %+v", pruned)
	assert.Contains(t, pruned.PrunedSessions, "w")
	c.call("spawn", map[string]any{"id": "tmp-gone", "name": "w", "command": "/bin/sh",
		"args": sh(`test -e /tmp/big && echo kept || echo pruned; echo x > /tmp/left`)}, nil)
	ev.exit("tmp-gone")
	assert.Equal(t, "pruned\n", ev.output("stdout", "tmp-gone"))
}

// checkJournalEmpty checks that the ext4 root disk img was left with an
// empty journal (dumpe2fs's "Journal start: 0"): the agent checkpoints it
// at shutdown, after the session's writes, so that the next start's mount
// replays nothing. It needs e2fsprogs' dumpe2fs, as the guest's formatting
// needs its mke2fs.
func checkJournalEmpty(t *testing.T, img string) {
	t.Helper()
	var dumpe2fs string
	// PATH may lack the sbin directories.
	for _, p := range []string{"dumpe2fs", "/usr/sbin/dumpe2fs", "/sbin/dumpe2fs"} {
		if found, err := exec.LookPath(p); err == nil {
			dumpe2fs = found
			break
		}
	}
	if dumpe2fs == "" {
		t.Log("no dumpe2fs here (e2fsprogs): the root disk's journal is not checked")
		return
	}
	out, err := exec.Command(dumpe2fs, "-h", img).Output()
	require.NoError(t, err, "dumpe2fs -h %s", img)
	assert.Regexp(t, `(?m)^Journal start:\s+0$`, string(out), "the root disk's journal after stopVM")
}
