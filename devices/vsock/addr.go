package vsock

import "fmt"

// Addr is a vsock address: a context id and a port.
type Addr struct {
	CID  uint64
	Port uint32
}

// Network returns "vsock".
func (a Addr) Network() string { return "vsock" }

// String returns "vm(CID):PORT" for a guest address and "host(2):PORT" for
// the host, the forms github.com/mdlayher/vsock prints.
func (a Addr) String() string {
	if a.CID == HostCID {
		return fmt.Sprintf("host(%d):%d", a.CID, a.Port)
	}
	return fmt.Sprintf("vm(%d):%d", a.CID, a.Port)
}
