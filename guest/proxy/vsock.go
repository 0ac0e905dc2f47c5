package proxy

import (
	"context"
	"fmt"
	"net"

	"github.com/mdlayher/vsock"

	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// VSockDialer reaches the helper's egress service in the VM: a vsock stream
// to host port guesthost.EgressVSockPort.
type VSockDialer struct{}

// DialHost implements HostDialer.
func (VSockDialer) DialHost(ctx context.Context) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := vsock.Dial(vsock.Host, guesthost.EgressVSockPort, nil)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("dialling the helper over vsock port %d: %w", guesthost.EgressVSockPort, r.err)
		}
		return r.conn, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}
