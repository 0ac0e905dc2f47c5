package nested

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// The rule every test that boots Linux follows, on every kind of host:
//
//   - where kvm.ProbeHost says this KVM boots Linux (a laptop, a cloud VM
//     with nested virtualisation, the harness's own outer guest), the test
//     boots directly (RequireLinuxBoot lets it run);
//   - elsewhere (no /dev/kvm, or PVM's /dev/kvm), its package's nested
//     wrapper runs it inside the harness when qemu and the outer kernel are
//     there (RequireHarness lets the wrapper run);
//   - otherwise both skip, saying why.
//
// "/dev/kvm exists" is never the test. Tiny guests, which are not Linux,
// need only a usable KVM (RequireKVM).

// LedgerEnv names a file to which every Linux boot a test completes is
// appended, one line each ("direct" or "nested", the package directory,
// the test), so CI can count what ran instead of trusting it.
const LedgerEnv = "COWORK_VMM_BOOT_LEDGER"

// payloadLedger is the ledger inside the outer guest, on the payload.
const payloadLedger = "boot-ledger"

// Ledger modes: booted directly, inside the x86 harness, inside the arm64
// harness (Options.Arch ArchARM64), inside it with a GICv2 (Options.GICv2).
const (
	LedgerDirect           = "direct"
	LedgerNested           = "nested"
	LedgerNestedARM64      = "nested-arm64"
	LedgerNestedARM64GICv2 = "nested-arm64-gicv2"
)

// ledgerMode is the mode of the boots a harness of arch (with a GICv2 if
// gicv2) records.
func ledgerMode(arch string, gicv2 bool) string {
	switch {
	case arch == ArchARM64 && gicv2:
		return LedgerNestedARM64GICv2
	case arch == ArchARM64:
		return LedgerNestedARM64
	}
	return LedgerNested
}

// RequireKVM skips t unless this host has a KVM the VMM can use at all
// (tiny guests run even on PVM), and returns the probe.
func RequireKVM(t testing.TB) kvm.HostProbe {
	t.Helper()
	p := kvm.ProbeHost(kvm.DevicePath)
	if err := p.Usable(); err != nil {
		t.Skipf("no usable KVM here (%v); the package's nested test runs this in the harness", err)
	}
	return p
}

// RequireLinuxBoot skips t unless this host's KVM boots Linux; wrapper
// names the nested test that runs t in the harness otherwise.
func RequireLinuxBoot(t testing.TB, wrapper string) {
	t.Helper()
	if err := kvm.ProbeHost(kvm.DevicePath).BootsLinux(); err != nil {
		t.Skipf("%v; %s runs this test in the nested harness", err, wrapper)
	}
}

// RequireHarness skips t, a nested wrapper, where the tests it wraps run
// directly (this KVM boots Linux; this also stops recursion inside the
// outer guest), in -short mode, or where the harness is unavailable.
func RequireHarness(t testing.TB) {
	t.Helper()
	if kvm.ProbeHost(kvm.DevicePath).BootsLinux() == nil {
		t.Skip("this host's KVM boots Linux: the wrapped tests run directly")
	}
	if testing.Short() {
		t.Skip("boots a qemu guest; skipped in -short mode")
	}
	if err := Available(); err != nil {
		t.Skipf("nested harness unavailable: %v", err)
	}
}

// RequireHarnessArch is RequireHarness for the harness of arch (Options.
// Arch): a wrapper whose tests run in the arm64 outer guest. Where arch is
// not this host's, its KVM cannot run those tests directly, whatever it
// boots, so only the harness's availability and -short count; inside the
// arm64 outer guest (arch is the host's there, and its KVM boots Linux)
// it skips, which stops recursion.
func RequireHarnessArch(t testing.TB, arch string) {
	t.Helper()
	arch, err := normalArch(arch)
	if err != nil {
		t.Fatal(err)
	}
	if arch == runtime.GOARCH && kvm.ProbeHost(kvm.DevicePath).BootsLinux() == nil {
		t.Skip("this host's KVM boots Linux: the wrapped tests run directly")
	}
	if testing.Short() {
		t.Skip("boots a qemu guest; skipped in -short mode")
	}
	if err := AvailableArch(arch); err != nil {
		t.Skipf("nested %s harness unavailable: %v", arch, err)
	}
}

// RequireARM64Harness is RequireHarnessArch(t, ArchARM64).
func RequireARM64Harness(t testing.TB) {
	t.Helper()
	RequireHarnessArch(t, ArchARM64)
}

// RecordLinuxBoot notes that t has booted Linux and seen it come up: a log
// line, and a ledger line when LedgerEnv is set.
func RecordLinuxBoot(t testing.TB) {
	t.Helper()
	dir, _ := os.Getwd()
	t.Logf("linux-boot: %s booted Linux (%s)", t.Name(), LedgerDirect)
	path := os.Getenv(LedgerEnv)
	if path == "" {
		return
	}
	if err := appendLedger(path, []string{ledgerLine(LedgerDirect, dir, t.Name())}); err != nil {
		t.Errorf("boot ledger: %v", err)
	}
}

func ledgerLine(mode, dir, test string) string {
	return strings.Join([]string{mode, dir, test}, "\t")
}

// appendLedger appends lines with one write (O_APPEND), so test binaries
// running side by side do not interleave them.
func appendLedger(path string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// mergeNestedLedger copies the boots recorded inside the outer guest (the
// payload's ledger) into the host's, as boots of mode (ledgerMode).
func mergeNestedLedger(payload, mode string) error {
	host := os.Getenv(LedgerEnv)
	if host == "" {
		return nil
	}
	f, err := os.Open(filepath.Join(payload, payloadLedger))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) != 3 || fields[0] != LedgerDirect {
			return fmt.Errorf("nested boot ledger: bad line %q", sc.Text())
		}
		lines = append(lines, ledgerLine(mode, fields[1], fields[2]))
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return appendLedger(host, lines)
}

// BuildCoworkVMM builds a static cowork-vmm into t's temporary directory
// (the kvm backend's guest /init must be static) and returns its path.
func BuildCoworkVMM(t testing.TB) string {
	t.Helper()
	return buildCoworkVMM(t, "CGO_ENABLED=0")
}

// BuildCoworkVMMArch is BuildCoworkVMM for arch (a GOARCH): what a test in
// the arm64 harness runs, built on the host and passed in GoTest.Files,
// since the arm64 outer guest has no go tool.
func BuildCoworkVMMArch(t testing.TB, arch string) string {
	t.Helper()
	return buildCoworkVMM(t, "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
}

func buildCoworkVMM(t testing.TB, env ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cowork-vmm")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/cowork-vmm/cowork-vmm/cmd/cowork-vmm")
	build.Env = append(os.Environ(), env...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building cowork-vmm (%s): %v\n%s", strings.Join(env, " "), err, out)
	}
	return bin
}
