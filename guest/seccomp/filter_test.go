package seccomp

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData lays out struct seccomp_data as the kernel gives it to the
// filter (native, little-endian) and returns it as x/net/bpf's VM reads
// it: that VM loads words big-endian, so each 32-bit word is swapped, and
// a load then sees the value the kernel's load would.
func seccompData(nr, arch uint32, args ...uint64) []byte {
	b := make([]byte, offArgs+8*6)
	binary.LittleEndian.PutUint32(b[offNr:], nr)
	binary.LittleEndian.PutUint32(b[offArch:], arch)
	for i, a := range args {
		binary.LittleEndian.PutUint64(b[offArgs+8*i:], a)
	}
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.LittleEndian.Uint32(b[i:]))
	}
	return b
}

// newVM loads the filter into x/net/bpf's interpreter.
func newVM(t testing.TB) *bpf.VM {
	t.Helper()
	raw, err := Program()
	require.NoError(t, err)
	require.LessOrEqual(t, len(raw), maxInstructions)
	prog, ok := bpf.Disassemble(raw)
	require.True(t, ok, "the program disassembles")
	vm, err := bpf.NewVM(prog)
	require.NoError(t, err)
	return vm
}

func run(t testing.TB, vm *bpf.VM, nr, arch uint32, args ...uint64) uint32 {
	t.Helper()
	v, err := vm.Run(seccompData(nr, arch, args...))
	require.NoError(t, err)
	return uint32(v)
}

// expected is the filter's policy written plainly, the reference the
// program is checked against.
func expected(nr, arch uint32, args [6]uint64) uint32 {
	switch {
	case arch != nativeArch:
		return retKill
	case x32Bit != 0 && nr&x32Bit != 0:
		return retDeny
	case slices.ContainsFunc(Denied(), func(s Syscall) bool { return s.Nr == nr }):
		return retDeny
	case nr == unix.SYS_IOCTL && slices.ContainsFunc(deniedIoctls, func(s Syscall) bool { return s.Nr == uint32(args[1]) }):
		return retDeny
	case nr == unix.SYS_PERSONALITY && !slices.Contains(allowedPersonalities, uint32(args[0])):
		return retDeny
	}
	return retAllow
}

func TestProgramVerdicts(t *testing.T) {
	vm := newVM(t)
	for _, s := range Denied() {
		assert.Equal(t, retDeny, run(t, vm, s.Nr, nativeArch), s.Name)
	}
	for _, nr := range []uint32{unix.SYS_READ, unix.SYS_WRITE, unix.SYS_OPENAT, unix.SYS_EXECVE, unix.SYS_CLONE,
		unix.SYS_UNSHARE, unix.SYS_MOUNT, unix.SYS_PTRACE, unix.SYS_EXIT_GROUP, unix.SYS_IO_URING_SETUP} {
		assert.Equal(t, uint32(retAllow), run(t, vm, nr, nativeArch), "syscall %d", nr)
	}
	assert.Equal(t, retDeny, run(t, vm, unix.SYS_KEYCTL, nativeArch, unix.KEYCTL_GET_KEYRING_ID, uint64(0xfffffffd)))

	// ioctl: only the request's low 32 bits count, as in the kernel.
	assert.Equal(t, retDeny, run(t, vm, unix.SYS_IOCTL, nativeArch, 0, unix.TIOCSTI))
	assert.Equal(t, retDeny, run(t, vm, unix.SYS_IOCTL, nativeArch, 0, 0xffffffff00000000|unix.TIOCSTI))
	assert.Equal(t, retDeny, run(t, vm, unix.SYS_IOCTL, nativeArch, 5, unix.TIOCLINUX))
	assert.Equal(t, uint32(retAllow), run(t, vm, unix.SYS_IOCTL, nativeArch, 0, unix.TCGETS))
	assert.Equal(t, uint32(retAllow), run(t, vm, unix.SYS_IOCTL, nativeArch, unix.TIOCSTI, unix.TIOCGWINSZ), "the request is argument 1, not 0")

	assert.Equal(t, uint32(retAllow), run(t, vm, unix.SYS_PERSONALITY, nativeArch, 0xffffffff))
	assert.Equal(t, uint32(retAllow), run(t, vm, unix.SYS_PERSONALITY, nativeArch, 0))
	assert.Equal(t, retDeny, run(t, vm, unix.SYS_PERSONALITY, nativeArch, 0x0400000), "READ_IMPLIES_EXEC")

	// Another ABI's numbers mean other calls: the process dies.
	for _, arch := range []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_ARM, 0} {
		assert.Equal(t, uint32(retKill), run(t, vm, unix.SYS_READ, arch), "arch %#x", arch)
	}
	if x32Bit != 0 {
		assert.Equal(t, retDeny, run(t, vm, x32Bit|unix.SYS_READ, nativeArch), "x32")
		assert.Equal(t, retDeny, run(t, vm, x32Bit|unix.SYS_IOCTL, nativeArch, 0, unix.TCGETS), "x32")
	}
}

func TestProgramShape(t *testing.T) {
	raw, err := Program()
	require.NoError(t, err)
	// arch check (3), nr load, x32, one compare per call, ioctl and
	// personality dispatch, their argument checks and the verdicts.
	assert.Less(t, len(raw), 100, "a short linear program")
	assert.Equal(t, raw, mustProgram(t), "deterministic")
	assert.Contains(t, Summary(), "ioctl TIOCSTI and TIOCLINUX refused")
	names := map[string]bool{}
	for _, s := range Denied() {
		assert.False(t, names[s.Name], "%s listed twice", s.Name)
		names[s.Name] = true
	}
	for _, want := range []string{"keyctl", "add_key", "request_key", "bpf", "kexec_load", "init_module"} {
		assert.True(t, names[want], want)
	}
}

func mustProgram(t *testing.T) []bpf.RawInstruction {
	raw, err := Program()
	require.NoError(t, err)
	return raw
}

func TestAssemblerRefusesBadJumps(t *testing.T) {
	var a assembler
	a.jump(bpf.JumpEqual, 1, "nowhere", "")
	a.ins(bpf.RetConstant{Val: retAllow})
	_, err := a.assemble()
	require.ErrorContains(t, err, `no label "nowhere"`)

	a = assembler{}
	a.label("back")
	a.ins(bpf.RetConstant{Val: retAllow})
	a.jump(bpf.JumpEqual, 1, "back", "")
	_, err = a.assemble()
	require.ErrorContains(t, err, "forward")

	a = assembler{}
	a.jump(bpf.JumpEqual, 1, "far", "")
	for range 300 {
		a.ins(bpf.RetConstant{Val: retAllow})
	}
	a.label("far")
	a.ins(bpf.RetConstant{Val: retDeny})
	_, err = a.assemble()
	require.ErrorContains(t, err, "spans 300")

	a = assembler{}
	for range maxInstructions + 1 {
		a.ins(bpf.RetConstant{Val: retAllow})
	}
	_, err = a.assemble()
	require.ErrorContains(t, err, "more than the kernel's 4096")
}

// FuzzProgram checks the assembled program against the plain policy for
// any call, architecture and arguments.
func FuzzProgram(f *testing.F) {
	f.Add(uint32(unix.SYS_IOCTL), uint32(nativeArch), uint64(0), uint64(unix.TIOCSTI))
	f.Add(uint32(unix.SYS_KEYCTL), uint32(nativeArch), uint64(0), uint64(0))
	f.Add(uint32(unix.SYS_PERSONALITY), uint32(nativeArch), uint64(8), uint64(0))
	f.Add(uint32(0x40000010), uint32(nativeArch), uint64(0), uint64(0))
	f.Add(uint32(unix.SYS_READ), uint32(unix.AUDIT_ARCH_I386), uint64(0), uint64(0))
	vm := newVM(f)
	f.Fuzz(func(t *testing.T, nr, arch uint32, arg0, arg1 uint64) {
		args := [6]uint64{arg0, arg1}
		require.Equal(t, expected(nr, arch, args), run(t, vm, nr, arch, args[:]...), "nr %d arch %#x args %#x %#x", nr, arch, arg0, arg1)
	})
}
