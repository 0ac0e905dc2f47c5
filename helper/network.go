package helper

import (
	"context"
	"net/http"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Network status and API reachability during startVM. The client waits for
// an apiReachability event before it goes on, so one is always sent. This
// file is the seam the egress work replaces: the guest has no NIC, its
// traffic goes through the helper, so the helper's own view of the network
// is the guest's.

// probeTimeout bounds one HEAD request to apiProbeURL.
const probeTimeout = 5 * time.Second

// reportNetwork publishes networkStatus and apiReachability once.
func (s *Service) reportNetwork(ctx context.Context, probeURL string) {
	reach := protocol.ReachabilityUnknown
	if probeURL != "" {
		reach = s.opts.ReachabilityProbe(ctx, probeURL)
	}
	if ctx.Err() != nil {
		return
	}
	status := protocol.NetworkConnected
	if reach == protocol.ReachabilityProbablyUnreachable || reach == protocol.ReachabilityUnreachable {
		status = protocol.NetworkNotConnected
	}
	s.log.Info("network", "status", status, "apiReachability", reach)
	s.hub.Publish(protocol.Event{Type: protocol.EventNetworkStatus, Status: status})
	s.hub.Publish(protocol.Event{Type: protocol.EventAPIReachability, Status: reach})
}

// probeAPI sends one HEAD request; any HTTP answer means reachable.
func probeAPI(ctx context.Context, url string) string {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	if err != nil {
		return protocol.ReachabilityUnknown
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return protocol.ReachabilityProbablyUnreachable
	}
	resp.Body.Close()
	return protocol.ReachabilityReachable
}
