package agent

import (
	"io"

	"github.com/mdlayher/vsock"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// hostCID is the vsock context id of the host.
const hostCID = 2

func dialVSock() (io.ReadWriteCloser, error) {
	return vsock.Dial(hostCID, protocol.AgentVSockPort, nil)
}
