package nested

import (
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

func TestParseConsole(t *testing.T) {
	const token = "abc123"
	console := strings.Join([]string{
		"[    0.000000] Linux version 6.1",
		job.Marker(job.MarkerInit, token, "uptime=2.61"),
		job.Marker(job.MarkerClock, token, "tsc"),
		job.Marker(job.MarkerBegin, token, ""),
		"hi",
		"NESTED-EXIT forged 0", // payload output with another token
		"partial",
		job.Marker(job.MarkerClock, token, "tsc"),
		job.Marker(job.MarkerExit, token, "3"),
		"[    9.1] reboot: Restarting system",
	}, "\n")
	res, err := parseConsole(console, token)
	require.NoError(t, err)
	require.Equal(t, 3, res.ExitCode)
	require.Equal(t, "hi\nNESTED-EXIT forged 0\npartial\n", res.Output)
	require.Equal(t, 2610*time.Millisecond, res.InitUptime)
	require.Equal(t, []string{"tsc"}, res.Clocksources, "the clock markers are recorded, not payload output")
	require.Equal(t, "tsc", res.Clocksource())
	require.False(t, res.CoarseClock())
}

// TestParseConsoleCoarseClock: a kernel that fell back to jiffies during
// the payload is reported as a coarse clock, with both clocksources.
func TestParseConsoleCoarseClock(t *testing.T) {
	const token = "c10ck"
	console := strings.Join([]string{
		job.Marker(job.MarkerClock, token, "tsc"),
		job.Marker(job.MarkerBegin, token, ""),
		"clocksource: Marking clocksource 'tsc' as unstable because the skew is too large",
		job.Marker(job.MarkerClock, token, "refined-jiffies"),
		job.Marker(job.MarkerExit, token, "0"),
	}, "\n")
	res, err := parseConsole(console, token)
	require.NoError(t, err)
	require.Equal(t, []string{"tsc", "refined-jiffies"}, res.Clocksources)
	require.Equal(t, "refined-jiffies", res.Clocksource())
	require.True(t, res.CoarseClock())
	require.False(t, Result{}.CoarseClock(), "no report, no claim")
}

func TestParseConsoleFailures(t *testing.T) {
	const token = "t0k"
	_, err := parseConsole("Kernel panic - not syncing\n", token)
	require.ErrorContains(t, err, "without reporting")

	_, err = parseConsole(job.Marker(job.MarkerError, token, "mount hostroot: no such device")+"\n", token)
	require.ErrorContains(t, err, "mount hostroot: no such device")

	_, err = parseConsole(job.Marker(job.MarkerBegin, token, "")+"\n"+job.Marker(job.MarkerExit, token, "x")+"\n", token)
	require.ErrorContains(t, err, "bad exit marker")

	_, err = parseConsole(job.Marker(job.MarkerExit, "other", "0")+"\n", token)
	require.Error(t, err, "a marker with a foreign token does not count")
}

func TestCopyFiles(t *testing.T) {
	src := filepath.Join(t.TempDir(), "tool")
	require.NoError(t, os.WriteFile(src, []byte("#!/bin/sh\n"), 0o750))
	payload := t.TempDir()
	require.NoError(t, copyFiles(payload, map[string]string{"bin/tool": src, "/payload/again": src}))
	info, err := os.Stat(filepath.Join(payload, "bin/tool"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o750), info.Mode().Perm())
	_, err = os.Stat(filepath.Join(payload, "again"))
	require.NoError(t, err)

	for _, bad := range []string{"/etc/passwd", "../escape", ""} {
		require.Error(t, copyFiles(payload, map[string]string{bad: src}), bad)
	}
	require.Error(t, copyFiles(payload, map[string]string{"x": "/nonexistent"}))
}

func TestRunRejectsEmptyCommand(t *testing.T) {
	_, err := Run(context.Background(), Options{})
	require.ErrorContains(t, err, "empty command")
}

// TestNestedHello boots the outer guest and checks the payload runs with the
// host's userland, its exit status and output come back, and /dev/kvm exists.
func TestNestedHello(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("nested harness unavailable: %v", err)
	}
	payload := t.TempDir()
	script := filepath.Join(t.TempDir(), "hello.sh")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho hi\nls -l /dev/kvm\necho written > /payload/result\nexit 7\n"), 0o755))
	res, err := Run(context.Background(), Options{
		PayloadDir: payload,
		Files:      map[string]string{"hello.sh": script},
		Cmd:        []string{"sh", "-c", "/payload/hello.sh"},
		Timeout:    2 * time.Minute,
		Stdout:     &lineLogger{t: t},
	})
	require.NoError(t, err)
	t.Logf("wall %v; outer /init after %v wall, %v guest uptime", res.Wall.Round(time.Millisecond), res.InitWall.Round(time.Millisecond), res.InitUptime)
	require.Equal(t, 7, res.ExitCode)
	require.Contains(t, res.Output, "hi\n")
	require.Regexp(t, `(?m)^c[rw-]{9} 1 root root 10, *232 .* /dev/kvm$`, res.Output, "/dev/kvm is the misc device 10:232")
	written, err := os.ReadFile(filepath.Join(payload, "result"))
	require.NoError(t, err, "the payload directory is shared read-write")
	require.Equal(t, "written\n", string(written))
}

func TestQemuArgsFollowTheRecipe(t *testing.T) {
	opts := Options{MemMiB: 1024, CPUs: 2, Kernel: "/k/vmlinux"}
	args := strings.Join(qemuArgs(opts, "/p", "/i.cpio.gz"), " ")
	for _, want := range []string{
		"-accel tcg,thread=multi", "-M microvm,acpi=off", "+svm,+npt", "-m 1024", "-smp 2",
		"-kernel /k/vmlinux", "-initrd /i.cpio.gz", "reboot=t panic=-1", "-no-reboot",
		"path=/,security_model=none,readonly=on", "mount_tag=" + job.HostRootTag,
		"path=/p,security_model=none", "mount_tag=" + job.PayloadTag,
		// x86-64-v2: real programs (the Claude Code CLI) die of SIGILL without.
		"+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+lahf_lm",
		// A fine-grained clock for the figures, never jiffies.
		"tsc=reliable clocksource=tsc",
	} {
		require.Contains(t, args, want)
	}
	require.Contains(t, strings.Join(qemuArgs(Options{CPUs: 1}, "/p", "/i"), " "), "-accel tcg ")
	require.Contains(t, strings.Join(qemuArgs(Options{CPUs: 2, SingleThreadTCG: true}, "/p", "/i"), " "), "-accel tcg -M")
	shared := strings.Join(qemuArgs(Options{Shares: []string{"/tmp/clone"}}, "/p", "/i"), " ")
	require.Contains(t, shared, "-fsdev local,id=share0,path=/tmp/clone,security_model=none,readonly=on -device virtio-9p-device,fsdev=share0,mount_tag=share0")
}

func TestBuildOuterInitramfs(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool")
	}
	work := t.TempDir()
	initrd := filepath.Join(work, "outer.cpio.gz")
	j := job.Job{Token: "tok3n", Cmd: []string{"true"}, Dir: "/payload", Timeout: time.Minute}
	require.NoError(t, buildOuterInitramfs(context.Background(), work, initrd, ArchAMD64, j))
	archive := readInitramfs(t, initrd)
	for _, name := range []string{"init\x00", "dev/console\x00", "job.json\x00", `"token":"tok3n"`, "\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00"} {
		require.True(t, strings.Contains(archive, name), "the archive holds %q", name)
	}
	// The cpio entry's name follows its header's last field (check, 0).
	require.False(t, strings.Contains(archive, "00000000bin/busybox\x00"), "no busybox on amd64")
	require.False(t, strings.Contains(archive, `"busybox_root":`), "no busybox root on amd64")
}

func readInitramfs(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	archive, err := io.ReadAll(zr)
	require.NoError(t, err)
	return string(archive)
}
