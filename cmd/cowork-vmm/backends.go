package main

import (
	"io"
	"log/slog"
	"os"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/helper/process"
	"github.com/cowork-vmm/cowork-vmm/helper/vm"
)

// backendFactories is where backends are plugged in: COWORK_VMM_BACKEND
// selects one by name ("kvm" when unset). agentLog receives the guest
// agent's log lines (process backend) and the guest's serial console (VM).
func backendFactories(log *slog.Logger, agentLog io.Writer) map[string]helper.BackendFactory {
	return map[string]helper.BackendFactory{
		helper.BackendKVM: func() (helper.Backend, error) {
			return vm.New(vm.Options{Logger: log, Console: agentLog, Cmdline: os.Getenv(vm.CmdlineEnv)}), nil
		},
		helper.BackendProcess: func() (helper.Backend, error) {
			return process.New(process.Options{Logger: log, Stderr: agentLog}), nil
		},
	}
}
