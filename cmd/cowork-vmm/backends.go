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
				FileSharing: os.Getenv(vm.FSEnv), SnapshotDir: vm.DefaultSnapshotDir(), Descriptors: descriptors}), nil
		},
		helper.BackendProcess: func() (helper.Backend, error) {
			return process.New(process.Options{Logger: log, Stderr: agentLog}), nil
		},
	}
}
