package nested

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested/arm64smoke"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// TestQemuArgsAMD64Unchanged pins the x86 outer guest's whole command line:
// the arm64 harness must leave it as it was.
func TestQemuArgsAMD64Unchanged(t *testing.T) {
	opts := Options{MemMiB: 2048, CPUs: 2, Kernel: "/k/vmlinux", Append: "loglevel=7", QemuLog: "/q.log",
		Shares: []string{"/tmp/mod", "/root/x"}, tscKHz: 2096000}
	want := []string{"-accel", "tcg,thread=multi", "-M", "microvm,acpi=off", "-cpu", "qemu64,+svm,+npt,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+lahf_lm", "-m", "2048", "-smp", "2", "-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-kernel", "/k/vmlinux", "-initrd", "/w/outer.cpio.gz", "-append", "console=ttyS0 reboot=t panic=-1 quiet tsc_early_khz=2096000 tsc=reliable clocksource=tsc loglevel=7", "-no-reboot", "-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on", "-device", "virtio-9p-device,fsdev=hostroot,mount_tag=hostroot", "-fsdev", "local,id=payload,path=/p,security_model=none", "-device", "virtio-9p-device,fsdev=payload,mount_tag=payload", "-d", "cpu_reset,guest_errors", "-D", "/q.log", "-fsdev", "local,id=share0,path=/tmp/mod,security_model=none,readonly=on", "-device", "virtio-9p-device,fsdev=share0,mount_tag=share0", "-fsdev", "local,id=share1,path=/root/x,security_model=none,readonly=on", "-device", "virtio-9p-device,fsdev=share1,mount_tag=share1"}
	require.Equal(t, want, qemuArgs(opts, "/p", "/w/outer.cpio.gz"))
	opts.Arch = ArchAMD64
	require.Equal(t, want, qemuArgs(opts, "/p", "/w/outer.cpio.gz"))
	require.Equal(t, qemuBinary, qemuBinaryFor(ArchAMD64))
}

// TestQemuArgsARM64: the virt machine at EL2 with a GICv3, the PL011
// console, no TSC options, no host root; the payload and the shares on
// virtio-mmio 9p devices.
func TestQemuArgsARM64(t *testing.T) {
	opts := Options{Arch: ArchARM64, MemMiB: 1024, CPUs: 2, Kernel: "/k/Image", Append: "loglevel=7", Shares: []string{"/work/mod"}, userland: "/c/root"}
	want := []string{"-accel", "tcg,thread=multi", "-M", "virt,virtualization=on,gic-version=3", "-cpu", "max,pauth-impdef=on", "-m", "1024", "-smp", "2", "-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-kernel", "/k/Image", "-initrd", "/i.cpio.gz", "-append", "console=ttyAMA0 panic=-1 quiet loglevel=7", "-no-reboot", "-fsdev", "local,id=payload,path=/p,security_model=none", "-device", "virtio-9p-device,fsdev=payload,mount_tag=payload", "-fsdev", "local,id=userland,path=/c/root,security_model=none,readonly=on", "-device", "virtio-9p-device,fsdev=userland,mount_tag=userland", "-fsdev", "local,id=share0,path=/work/mod,security_model=none,readonly=on", "-device", "virtio-9p-device,fsdev=share0,mount_tag=share0"}
	require.Equal(t, want, qemuArgs(opts, "/p", "/i.cpio.gz"))
	one := strings.Join(qemuArgs(Options{Arch: ArchARM64, CPUs: 1, QemuLog: "/q"}, "/p", "/i"), " ")
	require.Contains(t, one, "-accel tcg -M virt")
	require.Contains(t, one, "-d cpu_reset,guest_errors -D /q")
	require.NotContains(t, one, "tsc")
	require.NotContains(t, one, job.HostRootTag)
	require.Equal(t, "qemu-system-aarch64", qemuBinaryFor(ArchARM64))
	v2 := strings.Join(qemuArgs(Options{Arch: ArchARM64, CPUs: 1, GICv2: true}, "/p", "/i"), " ")
	require.Contains(t, v2, "-M virt,virtualization=on,gic-version=2 ")
	_, err := Run(t.Context(), Options{GICv2: true, Cmd: []string{"true"}})
	require.ErrorContains(t, err, "GICv2 and Pages16K are options of the arm64 harness")
}

func TestNormalArch(t *testing.T) {
	for in, want := range map[string]string{"": ArchAMD64, "amd64": ArchAMD64, "arm64": ArchARM64} {
		got, err := normalArch(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := normalArch("riscv64")
	require.ErrorContains(t, err, `architecture "riscv64"`)
	require.ErrorContains(t, AvailableArch("x86"), `want "amd64" or "arm64"`)
	_, err = Run(context.Background(), Options{Arch: "386", Cmd: []string{"true"}})
	require.ErrorContains(t, err, `architecture "386"`)
}

// fakeUserland points the userland cache at a directory holding a stand-in
// arm64 root (a file for each of userlandNeeds) and returns the root.
func fakeUserland(t *testing.T) string {
	t.Helper()
	cache := t.TempDir()
	t.Setenv(userlandEnv, cache)
	root := filepath.Join(cache, "v1", "root")
	require.NoError(t, os.Symlink("v1", filepath.Join(cache, "current")))
	for _, need := range userlandNeeds {
		p := filepath.Join(root, need)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte("stand-in "+need), 0o755))
	}
	return root
}

// TestARM64UserlandMissingSaysHow: without the cached userland, or with
// one from before curl and qemu joined it, the error names the script
// that fetches it; with it, the current version's root.
func TestARM64UserlandMissingSaysHow(t *testing.T) {
	t.Setenv(userlandEnv, t.TempDir())
	_, err := arm64Userland()
	require.ErrorContains(t, err, "scripts/arm64-userland.sh")
	root := fakeUserland(t)
	got, err := arm64Userland()
	require.NoError(t, err)
	require.Equal(t, root, got, "the current version's root")
	require.NoError(t, os.Remove(filepath.Join(root, "usr/bin/qemu-system-aarch64")))
	_, err = arm64Userland()
	require.ErrorContains(t, err, "qemu-system-aarch64")
	require.ErrorContains(t, err, "scripts/arm64-userland.sh")
}

// TestBuildOuterInitramfsARM64: /init is an arm64 ELF (e_machine 0xb7),
// the job asks for the userland root, and the userland is not packed.
func TestBuildOuterInitramfsARM64(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool")
	}
	fakeUserland(t)
	work := t.TempDir()
	initrd := filepath.Join(work, "outer.cpio.gz")
	j := job.Job{Token: "tok3n", Cmd: []string{"true"}, Dir: "/payload", Timeout: time.Minute, UserlandRoot: true}
	require.NoError(t, buildOuterInitramfs(context.Background(), work, initrd, ArchARM64, j))
	archive := readInitramfs(t, initrd)
	for _, want := range []string{"init\x00", `"userland_root":true`,
		"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"} {
		require.True(t, strings.Contains(archive, want), "the archive holds %q", want)
	}
	require.NotContains(t, archive, "stand-in", "the userland is shared, not packed")
}

// TestMergeNestedLedgerModes: the boots recorded inside the outer guest
// are merged as the harness's mode, so CI tells arm64 runs apart.
func TestMergeNestedLedgerModes(t *testing.T) {
	host := filepath.Join(t.TempDir(), "ledger")
	t.Setenv(LedgerEnv, host)
	payload := t.TempDir()
	inner := ledgerLine(LedgerDirect, "/src/machine", "TestBoot") + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(payload, payloadLedger), []byte(inner), 0o644))
	require.NoError(t, mergeNestedLedger(payload, ledgerMode(ArchAMD64, false)))
	require.NoError(t, mergeNestedLedger(payload, ledgerMode(ArchARM64, false)))
	got, err := os.ReadFile(host)
	require.NoError(t, err)
	require.Equal(t, "nested\t/src/machine\tTestBoot\nnested-arm64\t/src/machine\tTestBoot\n", string(got))

	require.NoError(t, os.WriteFile(filepath.Join(payload, payloadLedger), []byte("nested\t/x\tT\n"), 0o644))
	require.ErrorContains(t, mergeNestedLedger(payload, LedgerNested), "bad line")
}

// TestBootLedgerScriptCountsARM64: scripts/boot-ledger.sh counts the arm64
// harness's boots apart from the x86 harness's, and those with a GICv2
// among them.
func TestBootLedgerScriptCountsARM64(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	ledger := filepath.Join(t.TempDir(), "ledger")
	lines := "direct\t/d\tTestA\nnested\t/n\tTestB\nnested\t/n\tTestC\nnested-arm64\t/m\tTestD\nnested-arm64-gicv2\t/m\tTestD\n"
	require.NoError(t, os.WriteFile(ledger, []byte(lines), 0o644))
	out, err := exec.Command("bash", "../../scripts/boot-ledger.sh", ledger).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "ran: 5 (directly: 1, in the nested harness: 2, in the arm64 nested harness: 2, 1 of them with a GICv2)")
}

// TestNestedARM64Smoke runs the arm64smoke payload in the arm64 harness:
// an arm64 Go test that finds /dev/kvm working (API 12, KVM_CREATE_VM) and
// busybox's sh, and reports the run's wall time and the outer boot time.
func TestNestedARM64Smoke(t *testing.T) {
	RequireARM64Harness(t)
	res := RunGoTestWith(t, GoTest{
		Arch:    ArchARM64,
		Pkg:     "github.com/cowork-vmm/cowork-vmm/testharness/nested/arm64smoke",
		Run:     "^TestARM64Smoke$",
		Env:     []string{arm64smoke.InsideEnv + "=1"},
		Timeout: 5 * time.Minute,
	})
	require.Contains(t, res.Output, "--- PASS: TestARM64Smoke", "the payload ran, not skipped")
	t.Logf("arm64 smoke: wall %v, outer /init after %v wall (%v guest uptime), %s",
		res.Wall.Round(time.Millisecond), res.InitWall.Round(time.Millisecond), res.InitUptime, res.ClockNote())
}

// TestGoTestDirSharesModuleOnARM64: the arm64 outer guest does not see the
// host's root, so the module is always shared (the tests read testdata in
// their source directory); on amd64 only where the guest hides it.
func TestGoTestDirSharesModuleOnARM64(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool")
	}
	const pkg = "github.com/cowork-vmm/cowork-vmm/testharness/nested/arm64smoke"
	dir, shares := goTestDir(pkg, ArchARM64)
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(wd, "arm64smoke"), dir)
	modDir := filepath.Dir(filepath.Dir(wd))
	require.Equal(t, []string{modDir}, shares)
	_, amd64Shares := goTestDir(pkg, ArchAMD64)
	if job.HiddenInGuest(modDir) {
		require.Equal(t, []string{modDir}, amd64Shares)
	} else {
		require.Empty(t, amd64Shares)
	}
}

// TestBuildCoworkVMMArch: the helper is built for the asked architecture
// (an arm64 ELF, e_machine 0xb7), for tests in the arm64 harness.
func TestBuildCoworkVMMArch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the helper; skipped in -short mode")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool")
	}
	f, err := os.Open(BuildCoworkVMMArch(t, ArchARM64))
	require.NoError(t, err)
	defer f.Close()
	header := make([]byte, 20)
	_, err = io.ReadFull(f, header)
	require.NoError(t, err)
	require.Equal(t, []byte("\x7fELF"), header[:4])
	require.Equal(t, []byte{0xb7, 0x00}, header[18:20], "ELF machine AArch64")
}
