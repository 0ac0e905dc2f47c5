package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/sdkturn"
	"github.com/cowork-vmm/cowork-vmm/testharness/sdkcache"
)

// sdkBoot is one boot's four turns, every figure scaled by scale (ms).
func sdkBoot(scale int64) []fsbench.Result {
	var out []fsbench.Result
	for i, turn := range sdkturn.Turns {
		first := (int64(i) + 10) * scale * int64(time.Millisecond)
		out = append(out, fsbench.Result{Workload: turn.ID, Values: map[string]int64{sdkturn.KeyFirstByte: first, sdkturn.KeyExit: first + 100*int64(time.Millisecond)}})
	}
	return out
}

func sampleSDK() *sdkResults {
	r := newSDKResults(3)
	r.version = "2.1.337"
	r.notes = []string{"a note"}
	r.work = []SDKBootWork{
		{System: guestboot.FSOursVirtioFS, Run: 1, WindowMS: 4000, BusyMS: 3000, Runs: 900, IOExits: 100, MMIOExits: 700},
		{System: guestboot.FSOursVirtioFS, Run: 2, WindowMS: 5000, BusyMS: 3500, Runs: 1100, IOExits: 120, MMIOExits: 800},
		{System: guestboot.FSQemuVirtiofsd, Run: 1, WindowMS: 8000, BusyMS: 7000},
	}
	for run, scale := range []int64{100, 105, 95} {
		r.add(guestboot.FSOursVirtioFS, run+1, sdkBoot(scale))
		r.add(guestboot.FSQemuVirtiofsd, run+1, sdkBoot(2*scale))
		r.add(SDKNative, run+1, sdkBoot(scale*95/100))
	}
	return r
}

func TestSDKMetricsAreEveryTurnsFirstByteAndExit(t *testing.T) {
	require.Len(t, sdkMetrics, 2*len(sdkturn.Turns))
	var labels []string
	for _, m := range sdkMetrics {
		labels = append(labels, m.Label)
	}
	assert.Equal(t, []string{
		"claude -p → first byte (cold)", "claude -p → exit (cold)",
		"claude -p → first byte (warm)", "claude -p → exit (warm)",
		"stream-json turn → first byte (cold)", "stream-json turn → exit (cold)",
		"stream-json turn → first byte (warm)", "stream-json turn → exit (warm)",
	}, labels)
}

func TestSDKReportRatiosAndTargets(t *testing.T) {
	rep := sampleSDK().report()
	require.Len(t, rep.Systems, 3)
	ours := rep.metric(guestboot.FSOursVirtioFS, "print_cold_first_byte")
	require.NotNil(t, ours)
	assert.Equal(t, []float64{1000, 1050, 950}, ours.SamplesMS)
	assert.InDelta(t, 1000, ours.MedianMS, 1e-9)
	// The exit of the same turn.
	assert.InDelta(t, 1100, rep.metric(guestboot.FSOursVirtioFS, "print_cold_exit").MedianMS, 1e-9)

	r, ok := rep.ratio("print_cold_first_byte", SDKNative)
	require.True(t, ok)
	assert.InDelta(t, 1000.0/950, r, 1e-3, "ours over native")
	r, ok = rep.ratio("stream_warm_exit", guestboot.FSQemuVirtiofsd)
	require.True(t, ok)
	assert.InDelta(t, (13*100+100)/(13*200.0+100), r, 1e-3)

	require.Len(t, rep.Targets, 8, "the four first bytes, against native and against qemu + virtiofsd")
	for _, target := range rep.Targets {
		require.True(t, target.Measured, target.Label)
		require.True(t, target.Met, target.Label) // 1.05× native, 0.5× qemu
	}

	// 1.2× native misses the first target; equal to qemu misses "below".
	slow := newSDKResults(1)
	slow.add(guestboot.FSOursVirtioFS, 1, sdkBoot(120))
	slow.add(SDKNative, 1, sdkBoot(100))
	slow.add(guestboot.FSQemuVirtiofsd, 1, sdkBoot(120))
	for _, target := range slow.report().Targets {
		assert.True(t, target.Measured)
		assert.False(t, target.Met, target.Label)
	}
}

func TestSDKReportFailuresAndMissingSystems(t *testing.T) {
	r := newSDKResults(2)
	boot := sdkBoot(100)
	boot[2] = fsbench.Result{Workload: "stream_cold", Err: "the CLI failed: exit status 1"}
	r.add(guestboot.FSOursVirtioFS, 1, boot)
	r.skipped[guestboot.FSQemuVirtiofsd] = "no virtiofsd"
	rep := r.report()
	assert.Nil(t, rep.metric(guestboot.FSOursVirtioFS, "stream_cold_first_byte"), "a failed turn has no figure")
	assert.NotNil(t, rep.metric(guestboot.FSOursVirtioFS, "stream_warm_first_byte"))
	for _, target := range rep.Targets {
		assert.False(t, target.Measured, target.Label)
	}
	var b strings.Builder
	writeSDKMarkdown(&b, rep)
	md := b.String()
	assert.Contains(t, md, "- cowork-vmm virtio-fs failed: run 1, stream_cold: the CLI failed: exit status 1")
	assert.Contains(t, md, "- qemu microvm vhost-user-fs + virtiofsd not measured: no virtiofsd")
	assert.Contains(t, md, "- target: stream-json turn → first byte (warm): our guest ≤ 1.1× native: not measured (cowork-vmm virtio-fs 1.30 s)\n")
	assert.Contains(t, md, "- target: stream-json turn → first byte (cold): our guest ≤ 1.1× native: not measured\n")
}

func TestSDKMarkdownRowsAndTargetLines(t *testing.T) {
	rep := Report{Version: reportVersion, Backend: "kvm", SDK: sampleSDK().report()}
	// Through report.json, as cowork-bench prints it.
	var js bytes.Buffer
	require.NoError(t, WriteJSON(&js, rep))
	path := filepath.Join(t.TempDir(), "report.json")
	require.NoError(t, os.WriteFile(path, js.Bytes(), 0o644))
	var md bytes.Buffer
	require.NoError(t, PrintReport(&md, path))
	out := md.String()
	assert.NotContains(t, out, "| phase |", "no boot table without boot runs")
	assert.Contains(t, out, "### The real Claude Code CLI 2.1.337: 3 boot(s) per system")
	assert.Contains(t, out, "| turn | cowork-vmm virtio-fs | qemu microvm vhost-user-fs + virtiofsd | native (same machine, no VM) | ours / native | ours / qemu-virtiofsd |")
	assert.Contains(t, out, "| claude -p → first byte (cold) | 1.00 s (950.0 ms–1.05 s) | 2.00 s (1.90 s–2.10 s) | 950.0 ms (900.0 ms–990.0 ms) | 1.05× | 0.50× |")
	assert.Contains(t, out, "| stream-json turn → exit (warm) | 1.40 s")
	assert.Contains(t, out, "- target: claude -p → first byte (cold): our guest ≤ 1.1× native: 1.05×, met (cowork-vmm virtio-fs 1.00 s, native (same machine, no VM) 950.0 ms)")
	assert.Contains(t, out, "- target: stream-json turn → first byte (warm): our guest below qemu + virtiofsd: 0.50×, met")
	assert.Contains(t, out, "- a note")
	assert.Contains(t, out, "- cowork-vmm virtio-fs, a boot's turns and their set-up (median of 2): 4.50 s wall, this machine busy 3.25 s, 1000 KVM runs, 110 port I/O and 750 MMIO exits\n")
	assert.Contains(t, out, "- qemu microvm vhost-user-fs + virtiofsd, a boot's turns and their set-up (median of 1): 8.00 s wall, this machine busy 7.00 s\n")
	var back Report
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	assert.Equal(t, rep.SDK, back.SDK)
	var svg bytes.Buffer
	require.NoError(t, WriteSVG(&svg, rep), "a report with no boot phases still draws")
}

func TestSDKSkippedSection(t *testing.T) {
	r := newSDKResults(3)
	r.skip = "the Claude Code CLI 2.1.337 is not fetched"
	var b strings.Builder
	writeSDKMarkdown(&b, r.report())
	assert.Equal(t, "### The real Claude Code CLI: not measured\n\n- the Claude Code CLI 2.1.337 is not fetched\n\n", b.String())
	b.Reset()
	writeSDKMarkdown(&b, nil)
	assert.Empty(t, b.String())
}

func TestMeasureSDKSkipsWithoutTheCLI(t *testing.T) {
	t.Setenv(sdkcache.DirEnv, t.TempDir())
	b := &benchRun{opts: Options{SDKRuns: 1}, backend: "kvm", show: newProgress(nil)}
	require.NoError(t, b.measureSDK(t.Context()))
	rep := b.sdk.report()
	assert.Contains(t, rep.Skipped, "is not fetched")
	assert.Contains(t, rep.Skipped, "fetch-sdk.sh")

	b = &benchRun{opts: Options{SDKRuns: 1, SDKDir: t.TempDir()}, backend: "kvm", show: newProgress(nil)}
	require.NoError(t, b.measureSDK(t.Context()))
	assert.Contains(t, b.sdk.report().Skipped, "--sdk-dir")

	b = &benchRun{opts: Options{SDKRuns: 1, Benches: "boot,fs"}, show: newProgress(nil)}
	require.NoError(t, b.measureSDK(t.Context()))
	assert.Nil(t, b.sdk, "--benches leaves it out")
}

func TestStageSDK(t *testing.T) {
	src := t.TempDir()
	sdk := sdkcache.SDK{Dir: src, Version: "9.9.9"}
	require.NoError(t, os.MkdirAll(filepath.Join(src, "9.9.9"), 0o755))
	require.NoError(t, os.WriteFile(sdk.Binary(), []byte("#!/bin/sh\n"), 0o755))
	dir := t.TempDir()
	rel, err := stageSDK(dir, sdk)
	require.NoError(t, err)
	assert.Equal(t, "9.9.9/claude", rel)
	got, err := os.ReadFile(filepath.Join(dir, rel))
	require.NoError(t, err)
	assert.Equal(t, "#!/bin/sh\n", string(got))
	info, err := os.Stat(filepath.Join(dir, rel))
	require.NoError(t, err)
	assert.NotZero(t, info.Mode().Perm()&0o111, "still executable")
}
