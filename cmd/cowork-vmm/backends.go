package main

import (
	"io"
	"log/slog"
	"os"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/process"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/vm"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
)

// backendFactories is where backends are plugged in: COWORK_VMM_BACKEND
// selects one by name ("kvm" when unset); COWORK_VMM_FS the kvm backend's
// file-sharing device (virtio-fs, or 9p) and COWORK_VMM_SNAPSHOT=off its
// warm starts, read at each startVM. agentLog
// receives the guest agent's log lines (process backend) and the guest's
// serial console (VM). Every kvm backend made (one per VM) shares one
// descriptor budget, so the VMs of every profile together leave the
// helper the descriptors it needs.
func backendFactories(log *slog.Logger, agentLog io.Writer) map[string]helper.BackendFactory {
	descriptors := fdlimit.NewPool(0)
	return map[string]helper.BackendFactory{
		helper.BackendKVM: func() (helper.Backend, error) {
			return vm.New(vm.Options{Logger: log, Console: agentLog, Cmdline: os.Getenv(vm.CmdlineEnv),
				FileSharing: os.Getenv(vm.FSEnv), SnapshotDir: vm.DefaultSnapshotDir(), Descriptors: descriptors,
				NoBalloon: os.Getenv(vm.BalloonEnv) == "off", NoSuspend: os.Getenv(vm.SuspendEnv) == "off"}), nil
		},
		helper.BackendProcess: func() (helper.Backend, error) {
			return process.New(process.Options{Logger: log, Stderr: agentLog}), nil
		},
	}
}

// processFallbackHint ends a failed kvm start's error when the process
// backend is available (helper.Options.FallbackHint).
const processFallbackHint = "; on a host without usable KVM, set COWORK_VMM_BACKEND=process to run guests as sandboxed host processes"

// fallbackHint is the helper's FallbackHint for backend ("" meaning kvm,
// the helper's default): the kvm backend points at the process backend
// when that one is built in; others point nowhere.
func fallbackHint(backend string, factories map[string]helper.BackendFactory) string {
	if (backend == "" || backend == helper.BackendKVM) && factories[helper.BackendProcess] != nil {
		return processFallbackHint
	}
	return ""
}
