package probe

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Defaults of the monitors.
const (
	DefaultProbeInterval          = 30 * time.Second
	DefaultProbeTimeout           = 10 * time.Second
	DefaultStatusInterval         = 10 * time.Second
	DefaultFailuresForUnreachable = 3
)

// HTTPDoer sends a request; *http.Client implements it.
type HTTPDoer interface {
	Do(*http.Request) (*http.Response, error)
}

// NewHTTPClient returns a client for the probe that dials with dial (the
// egress server's DialContext, so the probe takes the guest's way out),
// ignores proxy variables and does not follow redirects (a 3xx is an
// answer).
func NewHTTPClient(dial func(ctx context.Context, network, address string) (net.Conn, error)) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         dial,
			TLSHandshakeTimeout: DefaultProbeTimeout,
			DisableKeepAlives:   true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Monitor emits apiReachability: a HEAD of ProbeURL every Interval, any
// HTTP answer meaning reachable, one failure probably_unreachable, and
// FailuresForUnreachable failures in a row unreachable. It emits on the
// first probe and on every change. Without ProbeURL it emits "unknown" once.
type Monitor struct {
	ProbeURL               string
	Client                 HTTPDoer // default NewHTTPClient(nil dial = net.Dialer)
	Emit                   func(protocol.Event)
	Interval               time.Duration
	Timeout                time.Duration
	FailuresForUnreachable int
	// Ticks, if set, replaces the interval timer (tests drive it).
	Ticks <-chan time.Time

	mu       sync.Mutex
	failures int
	last     string
}

// Run probes at once and then on every tick until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	if m.ProbeURL == "" {
		m.emitIfChanged(protocol.ReachabilityUnknown)
		return
	}
	ticks, stop := m.Ticks, func() {}
	if ticks == nil {
		interval := m.Interval
		if interval <= 0 {
			interval = DefaultProbeInterval
		}
		t := time.NewTicker(interval)
		ticks, stop = t.C, t.Stop
	}
	defer stop()
	m.ProbeOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			m.ProbeOnce(ctx)
		}
	}
}

// ProbeOnce sends one HEAD, updates the state, emits on change, and returns
// the status. A probe cut short by ctx changes nothing.
func (m *Monitor) ProbeOnce(ctx context.Context) string {
	if m.ProbeURL == "" {
		m.emitIfChanged(protocol.ReachabilityUnknown)
		return protocol.ReachabilityUnknown
	}
	ok := m.head(ctx)
	if ctx.Err() != nil {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.last
	}
	m.mu.Lock()
	threshold := m.FailuresForUnreachable
	if threshold <= 0 {
		threshold = DefaultFailuresForUnreachable
	}
	var status string
	switch {
	case ok:
		m.failures = 0
		status = protocol.ReachabilityReachable
	default:
		m.failures++
		status = protocol.ReachabilityProbablyUnreachable
		if m.failures >= threshold {
			status = protocol.ReachabilityUnreachable
		}
	}
	m.mu.Unlock()
	m.emitIfChanged(status)
	return status
}

func (m *Monitor) head(ctx context.Context) bool {
	timeout := m.Timeout
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, m.ProbeURL, nil)
	if err != nil {
		return false
	}
	client := m.Client
	if client == nil {
		client = NewHTTPClient(nil)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

func (m *Monitor) emitIfChanged(status string) {
	m.mu.Lock()
	changed := status != m.last
	m.last = status
	m.mu.Unlock()
	if changed && m.Emit != nil {
		m.Emit(protocol.Event{Type: protocol.EventAPIReachability, Status: status})
	}
}

// NetworkMonitor emits networkStatus at start and on change, checking every
// Interval.
type NetworkMonitor struct {
	Check    func(context.Context) string // e.g. NetworkChecker{...}.Status
	Emit     func(protocol.Event)
	Interval time.Duration // default DefaultStatusInterval
	Ticks    <-chan time.Time

	mu   sync.Mutex
	last string
}

// Run checks at once and then on every tick until ctx ends.
func (n *NetworkMonitor) Run(ctx context.Context) {
	ticks, stop := n.Ticks, func() {}
	if ticks == nil {
		interval := n.Interval
		if interval <= 0 {
			interval = DefaultStatusInterval
		}
		t := time.NewTicker(interval)
		ticks, stop = t.C, t.Stop
	}
	defer stop()
	n.CheckOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			n.CheckOnce(ctx)
		}
	}
}

// CheckOnce checks, emits on change, and returns the status.
func (n *NetworkMonitor) CheckOnce(ctx context.Context) string {
	check := n.Check
	if check == nil {
		check = NetworkStatus
	}
	status := check(ctx)
	if ctx.Err() != nil {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.last
	}
	n.mu.Lock()
	changed := status != n.last
	n.last = status
	n.mu.Unlock()
	if changed && n.Emit != nil {
		n.Emit(protocol.Event{Type: protocol.EventNetworkStatus, Status: status})
	}
	return status
}
