package main

import (
	"io"

	"github.com/cowork-vmm/cowork-vmm/guest/agent"
)

// guestRequestMain is `cowork-vmm guest-request [--timeout D] METHOD [JSON]`:
// run inside the guest (as protocol.GuestToolPath) by a spawned process, it
// asks the desktop client METHOD over the spawn's guest-request socket and
// prints the answer (see agent.GuestRequestMain).
func guestRequestMain(args []string, stdout, stderr io.Writer) int {
	return agent.GuestRequestMain(args, stdout, stderr)
}
