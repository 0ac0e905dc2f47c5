package bench

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
)

func TestQemuPeers(t *testing.T) {
	peers, notes := qemuPeers("/k/vmlinux", "", map[string]bool{"microvm": true})
	require.Len(t, peers, 1)
	assert.Empty(t, notes)
	args, err := peers[0].args(t.TempDir())
	require.NoError(t, err)
	assert.Equal(t, []string{"-M", "microvm,acpi=off", "-kernel", "/k/vmlinux"}, args)

	peers, _ = qemuPeers("/k/vmlinux", "", nil)
	require.Len(t, peers, 2)
	assert.Equal(t, SystemQemuQ35, peers[1].ID)
	args, err = peers[1].args(t.TempDir())
	require.NoError(t, err)
	assert.Contains(t, args, "q35")
	if code, _ := findOVMF(); code == "" {
		assert.Equal(t, "qemu q35 + SeaBIOS", peers[1].Label)
	}
	assert.Equal(t, "/k/vmlinux", args[len(args)-1], "without a bzImage q35 boots vmlinux (PVH)")
}

// TestQemuPeerReachesInit boots the guest initramfs under qemu's emulator
// (no KVM needed) and checks that the boot-timer byte is seen through the
// debugcon device on both machine types.
func TestQemuPeerReachesInit(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a kernel under qemu; skipped in -short mode")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	vmlinux, err := kernel.Find(kernel.Guest)
	if err != nil {
		t.Skipf("no guest kernel: %v", err)
	}
	bin := buildHelper(t)
	work := t.TempDir()
	initrd := filepath.Join(work, "initramfs.cpio")
	require.NoError(t, writeInitramfs(initrd, bin))
	peers, _ := qemuPeers(vmlinux, "", nil)
	for _, p := range peers {
		t.Run(p.ID, func(t *testing.T) {
			dir := filepath.Join(work, p.ID)
			args, err := p.args(t.TempDir())
			require.NoError(t, err)
			res, err := qemuBoot{Qemu: qemu, Args: args, Initrd: initrd, MemMiB: 256, Dir: dir, Timeout: 2 * time.Minute, Accel: "tcg"}.run(context.Background())
			require.NoError(t, err)
			assert.Contains(t, res.Phases, "start_to_init")
			require.NotNil(t, res.Memory)
			assert.True(t, res.Memory.Separated, "qemu's guest RAM mapping is found")
			assert.Positive(t, res.Memory.VMMKiB)
		})
	}
}

func TestHasEFIStub(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o644))
		return p
	}
	pe := make([]byte, 0x100)
	copy(pe, "MZ")
	binary.LittleEndian.PutUint32(pe[0x3c:], 0x80)
	copy(pe[0x80:], "PE\x00\x00")
	assert.True(t, hasEFIStub(write("efi", pe)))
	legacy := make([]byte, 0x100)
	legacy[0] = 0xea // a legacy boot sector starts with a jump
	assert.False(t, hasEFIStub(write("legacy", legacy)))
	binary.LittleEndian.PutUint32(pe[0x3c:], 0x1000) // e_lfanew past the end
	assert.False(t, hasEFIStub(write("short", pe)))
	assert.False(t, hasEFIStub(filepath.Join(dir, "missing")))
}
