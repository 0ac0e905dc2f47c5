// Command cowork-vmm is the Cowork helper and its tools: flags and
// subcommands only, the logic lives in the packages.
//
//	cowork-vmm -socket PATH          helper mode, as the desktop client starts it
//	cowork-vmm run [flags] -- CMD…   run one command in a fresh guest
//	cowork-vmm client [flags] -- CMD… run one command through a helper's socket
//	cowork-vmm agent [--fd N]        the guest agent (process backend; PID 1 in a VM)
//	cowork-vmm version
package main
