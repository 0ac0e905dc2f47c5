package arm64

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// qemuStubAddr is where the entry stub goes: in qemu virt's RAM above the
// 1 MiB qemu puts its own DTB at, below our RAM (qemu's -m 2G covers both).
const qemuStubAddr = 0x4020_0000

// entryStub returns AArch64 code doing what our VMM does to the boot vCPU:
// X0 = dtb, X1..X3 = 0, then a jump to the kernel.
func entryStub(dtb, kernel uint64) []byte {
	code := []uint32{
		0x580000c0, // ldr x0, [pc, #24]  (the DTB address below)
		0xaa1f03e1, // mov x1, xzr
		0xaa1f03e2, // mov x2, xzr
		0xaa1f03e3, // mov x3, xzr
		0x58000084, // ldr x4, [pc, #16]  (the kernel address below)
		0xd61f0080, // br x4
	}
	b := make([]byte, 0, 40)
	for _, c := range code {
		b = binary.LittleEndian.AppendUint32(b, c)
	}
	b = binary.LittleEndian.AppendUint64(b, dtb)
	return binary.LittleEndian.AppendUint64(b, kernel)
}

// TestPrepareBootQEMU boots the real guest Image, placed by PrepareBoot
// with our device tree, on qemu's TCG "virt" machine entered at EL1 like
// a KVM vCPU. qemu's GIC and UART are not where our layout puts them, so
// the kernel dies in gic_of_init reading our distributor address, where
// qemu has no GIC; by then it has taken X0, parsed our tree (command line,
// memory, PSCI over HVC, the GIC's reg) and printed through an earlycon
// given on our command line.
func TestPrepareBootQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a kernel under TCG (seconds): not in -short")
	}
	qemu, err := exec.LookPath("qemu-system-aarch64")
	if err != nil {
		t.Skip("qemu-system-aarch64 not installed (package qemu-system-arm)")
	}
	var image string
	for _, p := range realImages(t) {
		if filepath.Base(filepath.Dir(p)) == "guest-arm64-current" {
			image = p
		}
	}
	if image == "" {
		t.Skip("no guest-arm64-current/Image built")
	}
	kernel, err := os.ReadFile(image)
	require.NoError(t, err)

	const memBytes = 256 << 20
	cfg := BootConfig{
		MemBytes: memBytes, CPUs: 1, Kernel: kernel,
		Initrd:  bytes.Repeat([]byte{0x5a}, 0x3_0000),
		Cmdline: "earlycon=pl011,0x9000000 console=ttyS0 ourtree=yes memblock=debug",
		Virtio:  []MMIODevice{VirtioDevice(0)},
	}
	mem := newFakeMemory(memBytes)
	s, err := PrepareBoot(mem, cfg)
	require.NoError(t, err)

	dir := t.TempDir()
	args := []string{"-M", "virt,gic-version=3", "-cpu", "max", "-smp", "1", "-m", "2G",
		"-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot"}
	chunks := append(mem.chunks, memChunk{qemuStubAddr, entryStub(s.DTBAddr, s.KernelEntry)})
	for i, c := range chunks {
		path := filepath.Join(dir, fmt.Sprintf("chunk%d", i))
		require.NoError(t, os.WriteFile(path, c.data, 0o600))
		args = append(args, "-device", fmt.Sprintf("loader,file=%s,addr=%#x,force-raw=on", path, c.gpa))
	}
	args = append(args, "-device", fmt.Sprintf("loader,addr=%#x,cpu-num=0", qemuStubAddr))

	out := runUntil(t, qemu, args, "---[ end Kernel panic", time.Minute)
	for _, want := range []string{
		"Booting Linux on physical CPU 0x0000000000",
		"Kernel command line: earlycon=pl011,0x9000000 console=ttyS0 ourtree=yes",
		fmt.Sprintf("[mem 0x%016x-0x%016x]", RAMBase, RAMBase+memBytes-1),
		"psci: probing for conduit method from DT.",
		"psci: PSCIv1.1 detected in firmware.",
		"Hardware name: linux,dummy-virt (DT)",
		"gic_of_init",
		// memblock=debug shows the kernel reserving the initrd it found
		// in /chosen.
		fmt.Sprintf("memblock_reserve: [0x%016x-0x%016x] arm64_memblock_init", s.InitrdAddr, s.InitrdAddr+s.InitrdSize-1),
	} {
		require.Contains(t, out, want)
	}
}

// runUntil runs a command, returning its output once it prints marker,
// failing the test if it exits or times out first; the command is killed.
func runUntil(t *testing.T, name string, args []string, marker string, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out syncBuffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), marker) {
		select {
		case <-ctx.Done():
			t.Fatalf("no %q within %v; output:\n%s", marker, timeout, out.String())
		case err := <-exited:
			exited <- err // for the deferred wait
			t.Fatalf("exited (%v) before %q; output:\n%s", err, marker, out.String())
		case <-tick.C:
		}
	}
	time.Sleep(200 * time.Millisecond) // the rest of the panic message
	return out.String()
}

// syncBuffer is a bytes.Buffer safe for the command's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
