// Command cowork-vmm is the Cowork helper and its tools: flags and
// subcommands only, the logic lives in the packages. Its modes, as main.go
// dispatches them:
//
//	cowork-vmm -socket PATH [-debug]   helper mode, as the desktop client starts it
//	cowork-vmm run [flags] -- CMD…     run one command in a fresh guest
//	cowork-vmm client [flags] -- CMD…  run one command in a session of a running helper
//	cowork-vmm doctor [flags]          what this host can run, with a fix for each problem
//	cowork-vmm kernel-needed           for make run: exit 0 when a guest kernel should be built
//	cowork-vmm version                 version, commit, Go version, embedded guest kernel
//	cowork-vmm help                    the usage text
//
// Inside a guest (the agent's side of the same binary):
//
//	(PID 1, no arguments)              the VM's /init: the guest agent (agent.VMMain)
//	cowork-vmm agent [--fd N]          the guest agent of the process backend
//	cowork-vmm guest-request METHOD    ask the desktop client from a spawned process
//	cowork-vmm sudo … (or as "sudo")   run a command as root of the session's namespace
//	cowork-vmm root-exec PATH ARGV0 …  how the agent starts a sudo command (internal)
package main
