package proxy_test

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/devices/vsock"
	"github.com/cowork-vmm/cowork-vmm/devices/vsock/vsocktest"
	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/guest/proxy"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// guestVSockConn makes vsocktest's guest connection a net.Conn. Deadlines
// are not supported by the test stack (its calls are bounded by
// vsocktest.Timeout instead).
type guestVSockConn struct{ *vsocktest.GuestConn }

func (guestVSockConn) LocalAddr() net.Addr { return vsock.Addr{CID: 42} }
func (guestVSockConn) RemoteAddr() net.Addr {
	return vsock.Addr{CID: vsock.HostCID, Port: guesthost.EgressVSockPort}
}
func (guestVSockConn) SetDeadline(time.Time) error      { return nil }
func (guestVSockConn) SetReadDeadline(time.Time) error  { return nil }
func (guestVSockConn) SetWriteDeadline(time.Time) error { return nil }
func (c guestVSockConn) CloseWrite() error              { return c.Shutdown(vsock.ShutdownSend) }

// vsockDialer is the VM's VSockDialer played by vsocktest: the guest dials
// host port EgressVSockPort through the userspace virtio-vsock device.
type vsockDialer struct{ g *vsocktest.Guest }

func (d vsockDialer) DialHost(context.Context) (net.Conn, error) {
	c, err := d.g.Dial(guesthost.EgressVSockPort, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return guestVSockConn{c}, nil
}

// TestVMPath: proxy → virtio-vsock device → egress.Server on the device's
// listener for EgressVSockPort, as the VM backend wires it.
func TestVMPath(t *testing.T) {
	e := setup(t, nil, "pipe") // only for its upstream servers and URLs
	reg := egress.NewRegistry()
	token, _ := reg.Register("spawn-vm", []string{"allowed.test", "*.example.test"})
	srv := newServer(t, reg)

	dev, err := vsock.New(vsock.Config{GuestCID: 42})
	require.NoError(t, err)
	l, err := dev.Listen(guesthost.EgressVSockPort)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx, l)
	g := vsocktest.Start(t, dev, vsocktest.Options{})

	p, err := proxy.New(proxy.Config{SpawnID: "spawn-vm", Token: token, Dial: vsockDialer{g}})
	require.NoError(t, err)
	defer p.Close()
	proxyURL, _ := url.Parse(p.URL())
	client := &http.Client{Transport: &http.Transport{
		Proxy:             http.ProxyURL(proxyURL),
		TLSClientConfig:   e.client.Transport.(*http.Transport).TLSClientConfig,
		DisableKeepAlives: true,
	}}

	status, body, _ := get(t, client, e.plainURL("allowed.test"))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "hello from allowed.test:")
	<-e.seen
	status, body, _ = get(t, client, e.tlsURL("api.example.test"))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "hello from api.example.test:")
	<-e.seen
	status, body, header := get(t, client, e.plainURL("evil-example.test"))
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "blocked-by-allowlist", header.Get("X-Cowork-Egress"))
	require.Equal(t, "blocked-by-allowlist: evil-example.test\n", body)
	require.Empty(t, g.Errors(), "the host broke the vsock protocol")
}
