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

// probeInterval is how often apiProbeURL is probed while the guest runs.
const probeInterval = 30 * time.Second

// reportNetwork publishes networkStatus and apiReachability at once, then
// re-probes apiProbeURL (if any) every probeInterval and publishes changes,
// until ctx (the guest's life) ends.
func (s *Service) reportNetwork(ctx context.Context, probeURL string) {
	var lastReach, lastStatus string
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
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
		if status != lastStatus || reach != lastReach {
			s.log.Info("network", "status", status, "apiReachability", reach)
		}
		if status != lastStatus {
			s.hub.Publish(protocol.Event{Type: protocol.EventNetworkStatus, Status: status})
		}
		if reach != lastReach {
			s.hub.Publish(protocol.Event{Type: protocol.EventAPIReachability, Status: reach})
		}
		lastReach, lastStatus = reach, status
		if probeURL == "" {
			return // nothing to re-probe
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
