package main

import (
	"cmp"
	"os"
	"strconv"

	"github.com/cowork-vmm/cowork-vmm/bench"
	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// sdkInHarness returns the real CLI's bench's arguments for the run inside
// the harness, the host directory the harness must share for the CLI to
// be seen there (the user's cache lies under /root, which the outer guest
// replaces), and the outer guest memory the bench adds: its test guest's,
// the CLI's copy in the outer guest's tmpfs, and a native run of the CLI.
// Without the CLI here, the bench inside says it is not fetched.
func sdkInHarness(opts bench.Options) (args, shares []string, extraMiB int) {
	args = []string{"--sdk-runs", strconv.Itoa(opts.SDKRuns)}
	if !bench.SDKSelected(opts) {
		return args, nil, 0
	}
	mem := cmp.Or(opts.SDKMemMiB, bench.DefaultSDKMemMiB)
	args = append(args, "--sdk-mem", strconv.Itoa(mem))
	sdk, err := bench.FindSDK(opts.SDKDir)
	if err != nil {
		return args, nil, 0
	}
	args = append(args, "--sdk-dir", sdk.Dir)
	if job.HiddenInGuest(sdk.Dir) {
		shares = []string{sdk.Dir}
	}
	size := 0
	if info, err := os.Stat(sdk.Binary()); err == nil {
		size = int(info.Size() >> 20)
	}
	return args, shares, mem + size + nativeCLIMiB
}

// nativeCLIMiB is what a native run of the CLI holds besides its file.
const nativeCLIMiB = 512
