package main

import (
	"io"
	"log/slog"

	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/helper/process"
)

// backendFactories is where backends are plugged in: COWORK_VMM_BACKEND
// selects one by name. The kvm backend is not registered yet, so startVM on
// it fails with a message naming COWORK_VMM_BACKEND=process; the VM backend
// adds its entry here:
//
//	helper.BackendKVM: func() (helper.Backend, error) { return vm.New(...) },
//
// agentLog receives the guest agent's log lines.
func backendFactories(log *slog.Logger, agentLog io.Writer) map[string]helper.BackendFactory {
	return map[string]helper.BackendFactory{
		helper.BackendProcess: func() (helper.Backend, error) {
			return process.New(process.Options{Logger: log, Stderr: agentLog}), nil
		},
	}
}
