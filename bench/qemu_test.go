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
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

func TestQemuPeers(t *testing.T) {
	peers, notes := qemuPeers("/k/vmlinux", "", map[string]bool{"microvm": true}, false)
	require.Len(t, peers, 1)
	assert.Empty(t, notes)
	args, err := peers[0].args(t.TempDir())
	require.NoError(t, err)
	assert.Equal(t, []string{"-M", "microvm,acpi=off", "-kernel", "/k/vmlinux"}, args)

	peers, notes = qemuPeers("/k/vmlinux", "", nil, false)
	require.Len(t, peers, 2, "no OVMF row without a bzImage")
	assert.Equal(t, SystemQemuQ35, peers[1].ID)
	assert.Equal(t, "qemu q35 + SeaBIOS", peers[1].Label)
	args, err = peers[1].args(t.TempDir())
	require.NoError(t, err)
	assert.Equal(t, []string{"-M", "q35", "-kernel", "/k/vmlinux"}, args, "without a bzImage q35 boots vmlinux (PVH)")
	require.Len(t, notes, 2)
	assert.Contains(t, notes[1], "no q35 + OVMF row")

	// A relocatable bzImage without an EFI stub: OVMF's Linux loader boots it.
	bz := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(bz, setupHeader(0x20f, 1), 0o644))
	// In the nested harness, whatever is installed, not unless asked for.
	peers, notes = qemuPeers("/k/vmlinux", bz, nil, true)
	require.Len(t, peers, 2)
	assert.NotEqual(t, SystemQemuQ35OVMF, peers[1].ID)
	assert.Contains(t, notes[len(notes)-1], "no q35 + OVMF row: inside the nested harness")

	peers, notes = qemuPeers("/k/vmlinux", bz, map[string]bool{"ovmf": true}, false)
	if code, _ := findOVMF(); code == "" {
		assert.Empty(t, peers)
		assert.Equal(t, []string{"no q35 + OVMF row (the official helper's firmware): no OVMF firmware found (apt-get install ovmf)"}, notes)
		return
	}
	require.Len(t, peers, 1)
	assert.Empty(t, notes)
	assert.Equal(t, SystemQemuQ35OVMF, peers[0].ID)
	work := t.TempDir()
	args, err = peers[0].args(work)
	require.NoError(t, err)
	assert.Equal(t, bz, args[len(args)-1])
	assert.Contains(t, args, "if=pflash,format=raw,unit=1,file="+filepath.Join(work, "OVMF_VARS.fd"), "each boot writes its own copy of the variable store")
	assert.FileExists(t, filepath.Join(work, "OVMF_VARS.fd"))

	// In the nested harness only when asked for by name.
	peers, _ = qemuPeers("/k/vmlinux", bz, map[string]bool{"ovmf": true}, true)
	require.Len(t, peers, 1)
	assert.Equal(t, SystemQemuQ35OVMF, peers[0].ID)

	require.NoError(t, os.WriteFile(bz, setupHeader(0x20f, 0), 0o644))
	peers, notes = qemuPeers("/k/vmlinux", bz, map[string]bool{"ovmf": true}, false)
	assert.Empty(t, peers, "a kernel that is neither relocatable nor an EFI stub")
	require.Len(t, notes, 1)
	assert.Contains(t, notes[0], "neither an EFI stub nor CONFIG_RELOCATABLE")
}

// setupHeader returns the start of a bzImage whose boot protocol is
// version and whose relocatable_kernel byte is relocatable.
func setupHeader(version uint16, relocatable byte) []byte {
	b := make([]byte, 0x400)
	binary.LittleEndian.PutUint16(b[x86.SHBootFlag:], x86.BootFlagMagic)
	binary.LittleEndian.PutUint32(b[x86.SHHeader:], x86.HeaderMagic)
	binary.LittleEndian.PutUint16(b[x86.SHVersion:], version)
	b[x86.SHRelocatable] = relocatable
	return b
}

// fileWriter returns a function that writes a file of dir and returns its
// path.
func fileWriter(t *testing.T, dir string) func(name string, b []byte) string {
	return func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o644))
		return p
	}
}

func TestIsRelocatable(t *testing.T) {
	dir := t.TempDir()
	write := fileWriter(t, dir)
	assert.True(t, isRelocatable(write("reloc", setupHeader(0x20f, 1))))
	assert.False(t, isRelocatable(write("fixed", setupHeader(0x20f, 0))))
	assert.False(t, isRelocatable(write("old", setupHeader(0x204, 1))), "relocatable_kernel is only defined from protocol 2.05")
	noMagic := setupHeader(0x20f, 1)
	copy(noMagic[x86.SHHeader:], "XXXX")
	assert.False(t, isRelocatable(write("nomagic", noMagic)))
	assert.False(t, isRelocatable(write("short", setupHeader(0x20f, 1)[:x86.SHRelocatable])))
	assert.False(t, isRelocatable(filepath.Join(dir, "missing")))
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
	// With the bzImage beside vmlinux, as the bench runs them: q35 boots
	// it under SeaBIOS and under OVMF (when installed).
	peers, notes := qemuPeers(vmlinux, BzImageBeside(vmlinux), nil, false)
	for _, n := range notes {
		t.Log(n)
	}
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
	write := fileWriter(t, dir)
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
