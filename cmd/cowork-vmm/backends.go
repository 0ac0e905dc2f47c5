package main

import (
	"io"
	"log/slog"
	"os"

	"github.com/cowork-vmm/cowork-vmm/helper"
	kvmbackend "github.com/cowork-vmm/cowork-vmm/helper/backend/kvm"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/process"
)

// backendFactories is where backends are plugged in: COWORK_VMM_BACKEND
// selects one by name ("kvm" when unset); COWORK_VMM_FS the kvm backend's
// file-sharing device (virtio-fs, or 9p) and COWORK_VMM_SNAPSHOT=off its
// warm starts, read at each startVM. agentLog
// receives the guest agent's log lines (process backend) and the guest's
// serial console (VM).
func backendFactories(log *slog.Logger, agentLog io.Writer) map[string]helper.BackendFactory {
	return map[string]helper.BackendFactory{
		helper.BackendKVM: func() (helper.Backend, error) {
			return kvmbackend.New(kvmbackend.Options{Logger: log, Console: agentLog, Cmdline: os.Getenv(kvmbackend.CmdlineEnv),
				FileSharing: os.Getenv(kvmbackend.FSEnv), SnapshotDir: kvmbackend.DefaultSnapshotDir()}), nil
		},
		helper.BackendProcess: func() (helper.Backend, error) {
			return process.New(process.Options{Logger: log, Stderr: agentLog}), nil
		},
	}
}
