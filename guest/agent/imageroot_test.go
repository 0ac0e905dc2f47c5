package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

func TestParseFstab(t *testing.T) {
	fstab := `# the stand-in bundle's
LABEL=cloudimg-rootfs	/	ext4	discard,errors=remount-ro	0 1
LABEL=UEFI	/boot/efi	vfat	umask=0077	0 1
LABEL=cowork-data	/opt/cowork-data	ext4	defaults,nofail	0 2
LABEL=conda /opt/my\040conda ext4 ro,noatime 0 2
UUID=1234 /srv ext4 defaults 0 2
LABEL=evil ../../etc ext4 defaults 0 2
LABEL=evil2 /a/../b ext4 defaults 0 2
short line

/dev/vdb none swap sw 0 0
`
	entries, skipped := parseFstab(strings.NewReader(fstab))
	assert.Equal(t, []fstabEntry{
		{label: "UEFI", target: "/boot/efi", fsType: "vfat"},
		{label: "cowork-data", target: "/opt/cowork-data", fsType: "ext4"},
		{label: "conda", target: "/opt/my conda", fsType: "ext4", readOnly: true},
	}, entries)
	require.Len(t, skipped, 5)
	assert.Contains(t, skipped[0], "UUID=1234 at /srv: only LABEL=")
	assert.Contains(t, skipped[1], `"../../etc" is not an absolute clean path`)
	assert.Contains(t, skipped[2], `"/a/../b"`)
	assert.Contains(t, skipped[3], "fewer than 3 fields")
	assert.Contains(t, skipped[4], "/dev/vdb at none")
}

// TestParseFstabIsBounded: a huge fstab is read only up to its bound,
// and a line longer than the bound ends the parse with a reason.
func TestParseFstabIsBounded(t *testing.T) {
	line := "LABEL=x /x ext4 defaults 0 0\n"
	entries, _ := parseFstab(strings.NewReader(strings.Repeat(line, 100000)))
	assert.LessOrEqual(t, len(entries), maxFstabBytes/len(line)+1, "the cut last line may count")
	assert.GreaterOrEqual(t, len(entries), maxFstabBytes/len(line))
	_, skipped := parseFstab(strings.NewReader(strings.Repeat("a", 2*maxFstabBytes)))
	require.Len(t, skipped, 1)
	assert.Contains(t, skipped[0], "the rest")
}

func TestUnescapeFstab(t *testing.T) {
	assert.Equal(t, "/a b", unescapeFstab(`/a\040b`))
	assert.Equal(t, `/a\04`, unescapeFstab(`/a\04`))
	assert.Equal(t, `/a\999`, unescapeFstab(`/a\999`))
	assert.Equal(t, "/plain", unescapeFstab("/plain"))
}

func TestValidateImageRoot(t *testing.T) {
	ok := protocol.ImageRoot{Serial: "cowork-image-root", Images: []protocol.ImageDisk{{Serial: "cwimg-data", Label: "cowork-data"}}}
	require.NoError(t, validateImageRoot(ok))
	many := make([]protocol.ImageDisk, maxImages+1)
	for i := range many {
		many[i] = protocol.ImageDisk{Serial: "s" + strings.Repeat("x", i%19), Label: "l"}
	}
	for name, tc := range map[string]struct {
		r    protocol.ImageRoot
		want string
	}{
		"no serial":      {protocol.ImageRoot{}, "must be 1 to 20 bytes"},
		"long serial":    {protocol.ImageRoot{Serial: strings.Repeat("s", 21)}, "must be 1 to 20 bytes"},
		"space":          {protocol.ImageRoot{Serial: "a b"}, "printable ASCII"},
		"control":        {protocol.ImageRoot{Serial: "a\x01"}, "printable ASCII"},
		"too many":       {protocol.ImageRoot{Serial: "r", Images: many}, "at most 16"},
		"no label":       {protocol.ImageRoot{Serial: "r", Images: []protocol.ImageDisk{{Serial: "d"}}}, "label"},
		"long label":     {protocol.ImageRoot{Serial: "r", Images: []protocol.ImageDisk{{Serial: "d", Label: strings.Repeat("l", 17)}}}, "label"},
		"slash label":    {protocol.ImageRoot{Serial: "r", Images: []protocol.ImageDisk{{Serial: "d", Label: "a/b"}}}, "label"},
		"root's serial":  {protocol.ImageRoot{Serial: "r", Images: []protocol.ImageDisk{{Serial: "r", Label: "a"}}}, "twice"},
		"label twice":    {protocol.ImageRoot{Serial: "r", Images: []protocol.ImageDisk{{Serial: "a", Label: "x"}, {Serial: "b", Label: "x"}}}, "twice"},
		"bad img serial": {protocol.ImageRoot{Serial: "r", Images: []protocol.ImageDisk{{Serial: "", Label: "x"}}}, "must be 1 to 20"},
	} {
		err := validateImageRoot(tc.r)
		if assert.Error(t, err, name) {
			assert.Contains(t, err.Error(), tc.want, name)
		}
	}
}

// TestSetupRefusesABadImageRoot: the agent validates ImageRoot before it
// touches anything, and refuses it mixed with the host's system mounts.
func TestSetupRefusesABadImageRoot(t *testing.T) {
	m := newMounter(slog.New(slog.DiscardHandler), false)
	err := m.setup(protocol.SetupParams{ImageRoot: &protocol.ImageRoot{Serial: "bad serial"}}, newStepTimer())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "printable ASCII")
	err = m.setup(protocol.SetupParams{ImageRoot: &protocol.ImageRoot{Serial: "ok"}, System: []protocol.Mount{
		{Source: protocol.MountSource{Kind: protocol.MountKindTmpfs}, Target: "/usr"}}}, newStepTimer())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "without system mounts")
	assert.False(t, m.setupRan)
}

// TestImageSystemMounts: the image's top-level system directories are
// bound writable, its symlinks (merged /usr) made as such, and nothing
// else of its root (its /tmp, /boot, /proc) is taken.
func TestImageSystemMounts(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"usr", "etc", "var", "home", "root", "tmp", "boot", "proc"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	require.NoError(t, os.Symlink("usr/bin", filepath.Join(dir, "bin")))
	require.NoError(t, os.Symlink("usr/lib", filepath.Join(dir, "lib")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "opt"), nil, 0o644)) // not a directory: left out
	system, err := imageSystemMounts(dir)
	require.NoError(t, err)
	var got []string
	for _, mt := range system {
		assert.False(t, mt.ReadOnly, mt.Target)
		switch mt.Source.Kind {
		case protocol.MountKindBind:
			assert.Equal(t, filepath.Join(dir, mt.Target), mt.Source.Path)
			got = append(got, mt.Target)
		case protocol.MountKindSymlink:
			got = append(got, mt.Target+"->"+mt.Source.Path)
		}
	}
	assert.Equal(t, []string{"/usr", "/etc", "/var", "/home", "/root", "/bin->usr/bin", "/lib->usr/lib"}, got)

	_, err = imageSystemMounts(t.TempDir())
	require.Error(t, err, "an empty image is no userland")
}

// TestReadImageFileFollowsNoSymlink: the image's fstab is read within
// the image; a symlink (to the agent's own files) is not followed.
func TestReadImageFileFollowsNoSymlink(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "fstab"), []byte("secret"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "etc"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(outside, "fstab"), filepath.Join(dir, "etc", "fstab")))
	_, err := readImageFile(dir, "/etc/fstab")
	require.Error(t, err)
	require.NoError(t, os.Remove(filepath.Join(dir, "etc", "fstab")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "etc", "fstab"), []byte("LABEL=a /a ext4"), 0o644))
	got, err := readImageFile(dir, "/etc/fstab")
	require.NoError(t, err)
	assert.Equal(t, "LABEL=a /a ext4", string(got))
}

func TestIsExtType(t *testing.T) {
	for fs, want := range map[string]bool{"ext4": true, "ext3": true, "ext2": true, "auto": true, "vfat": false, "xfs": false, "": false} {
		assert.Equal(t, want, isExtType(fs), fs)
	}
}

// TestPlanFstabMounts: each image is mounted once, at the first ext
// entry naming its label; other types, unknown labels and repeats are
// skipped with why.
func TestPlanFstabMounts(t *testing.T) {
	images := []protocol.ImageDisk{{Serial: "cwimg-data", Label: "cowork-data"}, {Serial: "cwimg-conda", Label: "conda"}}
	entries := []fstabEntry{
		{label: "UEFI", target: "/boot/efi", fsType: "vfat"},
		{label: "cowork-data", target: "/opt/cowork-data", fsType: "ext4"},
		{label: "cowork-data", target: "/srv/again", fsType: "ext4"},
		{label: "nobody", target: "/x", fsType: "ext4"},
		{label: "conda", target: "/opt/conda", fsType: "auto", readOnly: true},
	}
	plan, skipped := planFstabMounts(entries, images)
	assert.Equal(t, []fstabMount{{serial: "cwimg-data", entry: entries[1]}, {serial: "cwimg-conda", entry: entries[4]}}, plan)
	require.Len(t, skipped, 3)
	assert.Contains(t, skipped[0], `type "vfat"`)
	assert.Contains(t, skipped[1], "mounted already")
	assert.Contains(t, skipped[2], "no image of the bundle has that label")
}
