package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// maxProfiles bounds the profiles one helper serves (each has its own
// guest, event backlog and egress server), besides the default profile.
const maxProfiles = 32

// Helper is the helper: one Service per profile (userDataName +
// userDataRoot, an Electron profile of the client), each with its own
// guest, processes, sessions directory, disk quota, SDK, token and events,
// and the routing of every call to the Service of its profile:
//
//   - configure names its profile. On a connection (a pipe, whose first call
//     it is) it also becomes that connection's profile (protocol.ConnState),
//     so the pipe's later calls act on it.
//   - A call on a connection that named no profile — a one-shot call, a pipe
//     call before the pipe's configure, an in-process call — acts on the last
//     profile a configure named (on any connection; kept in helper.json, so
//     also after a restart), or on the default profile (the empty name and
//     root) before any configure. The default profile does not count
//     against maxProfiles: a call before any configure takes no client
//     profile's place.
//   - A connection whose configure failed (the profile limit, bad params)
//     fails every later call with that error: it never acts on another
//     profile.
//   - subscribeEvents names its profile in its params: it receives that
//     profile's events only.
//
// It is safe for concurrent use.
type Helper struct {
	opts      Options
	log       *slog.Logger
	testHosts *testHosts // EgressTestHostsEnv, nil in production
	store     *store     // nil when Options.Stateless

	mu       sync.Mutex
	services map[profileKey]*Service
	states   profiles // the state files New found
	// owner is the profile whose sessions are <data>/sessions; nil until
	// the first profile takes them (none may while a state file is
	// unreadable: it might be the owner's).
	owner  *profileKey
	last   profileKey // the last profile a configure named
	closed bool

	persistMu sync.Mutex // serialises helper.json writes

	stopWatch chan struct{} // ends watchMemory; closed by Close
}

// New returns a Helper serving opts.DataDir (created if missing) with the
// state a previous helper left there.
func New(opts Options) (*Helper, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the data directory: %w", err)
	}
	var th *testHosts
	if opts.EgressTestHosts != "" {
		if th, err = parseEgressTestHosts(opts.EgressTestHosts); err != nil {
			return nil, err
		}
		log.Warn("TEST MODE: egress resolves only the names of "+EgressTestHostsEnv+" and dials only their loopback addresses; never use this in production",
			"hosts", opts.EgressTestHosts)
	}
	if opts.MemInfo != "/proc/meminfo" {
		log.Warn("TEST MODE: the host's memory is read from " + opts.MemInfo + " (" + MemInfoEnv + "), not /proc/meminfo; never use this in production")
	}
	h := &Helper{opts: opts, log: log, testHosts: th, services: map[profileKey]*Service{}, stopWatch: make(chan struct{})}
	if !opts.Stateless {
		h.store = &store{dir: opts.DataDir, log: log}
	}
	h.states = h.store.loadProfiles()
	if k, ok := h.states.owner(); ok {
		h.owner = &k
	}
	if hs := h.store.loadHelper(); hs.LastProfile != nil {
		h.last = hs.LastProfile.key()
	}
	go h.watchMemory(h.stopWatch)
	return h, nil
}

// Profile returns the Service of a profile, creating it (with the state a
// previous helper saved for it) if need be.
func (h *Helper) Profile(userDataName, userDataRoot string) (*Service, error) {
	return h.service(profileKey{name: userDataName, root: userDataRoot})
}

func (h *Helper) service(key profileKey) (*Service, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.services[key]; s != nil {
		return s, nil
	}
	if h.closed {
		return nil, errors.New("the helper is shutting down")
	}
	if key != (profileKey{}) && h.namedProfiles() >= maxProfiles {
		return nil, fmt.Errorf("this helper already serves %d profiles, its limit", maxProfiles)
	}
	ps := h.states.byID[profileID(key)]
	ps.wireKey = *key.wire()
	sessionsDir := filepath.Join(h.opts.DataDir, profilesDirName, profileID(key), sessionsDirName)
	if ps.OwnsDataSessions {
		sessionsDir = filepath.Join(h.opts.DataDir, sessionsDirName)
	} else if h.claimDataSessions(&ps) {
		sessionsDir = filepath.Join(h.opts.DataDir, sessionsDirName)
	}
	s := newService(h, key, ps, sessionsDir)
	h.services[key] = s
	h.log.Info("profile", "profile", key.name, "root", key.root, "sessions", sessionsDir)
	return s, nil
}

// namedProfiles counts the profiles served that count against
// maxProfiles: all but the default one, which calls made before any
// configure act on (one more at most, so the bound holds). Called with h.mu
// held.
func (h *Helper) namedProfiles() int {
	n := len(h.services)
	if h.services[profileKey{}] != nil {
		n--
	}
	return n
}

// claimDataSessions makes ps, a profile met for the first time, the owner
// of <data>/sessions if no profile owns it yet and ps is a profile of the
// desktop client — one with a userDataRoot (not the default profile, nor
// the client subcommand's) — and the helper is not stateless; the claim is
// saved at once. Called with h.mu held.
func (h *Helper) claimDataSessions(ps *profileState) bool {
	key := ps.key()
	if h.store == nil || key.root == "" || h.owner != nil || h.states.unreadable {
		return false
	}
	ps.OwnsDataSessions = true
	if err := h.store.saveProfile(*ps); err != nil {
		h.log.Error("cannot record the profile that owns the data directory's sessions; it gets a directory of its own", "profile", key.name, "err", err)
		ps.OwnsDataSessions = false
		return false
	}
	h.owner = &key
	h.states.byID[profileID(key)] = *ps
	return true
}

// serviceFor is the Service a call on ctx's connection acts on (see Helper).
func (h *Helper) serviceFor(ctx context.Context) (*Service, error) {
	if st := protocol.ConnStateFrom(ctx); st != nil {
		switch v := st.Get().(type) {
		case profileKey:
			return h.service(v)
		case refusedConfigure:
			return nil, v.err
		}
	}
	h.mu.Lock()
	key := h.last
	h.mu.Unlock()
	return h.service(key)
}

// refusedConfigure is the state of a connection whose configure failed:
// its later calls fail with the same error. Acting on another profile (the
// last configured) would run them in that profile's guest and sessions,
// with its token.
type refusedConfigure struct{ err error }

// configureProfile is the routing half of configure: the Service of the
// profile it names, which becomes the connection's and the last profile.
// When it fails, the connection is refused for good (refusedConfigure).
func (h *Helper) configureProfile(ctx context.Context, params json.RawMessage) (*Service, error) {
	st := protocol.ConnStateFrom(ctx)
	if st != nil {
		if r, ok := st.Get().(refusedConfigure); ok {
			return nil, r.err
		}
	}
	refuse := func(err error) (*Service, error) {
		if st != nil {
			st.Set(refusedConfigure{err})
		}
		return nil, err
	}
	p, err := protocol.DecodeParams[protocol.ConfigureParams](protocol.MethodConfigure, params)
	if err != nil {
		return refuse(err)
	}
	key := profileKey{name: p.UserDataName, root: p.UserDataRoot}
	s, err := h.service(key)
	if err != nil {
		return refuse(fmt.Errorf("configure: %w", err))
	}
	if st != nil {
		st.Set(key)
	}
	h.setLast(key)
	return s, nil
}

// setLast records the last configured profile (and saves it when it
// changed).
func (h *Helper) setLast(key profileKey) {
	h.persistMu.Lock()
	defer h.persistMu.Unlock()
	h.mu.Lock()
	changed := h.last != key
	h.last = key
	h.mu.Unlock()
	if !changed {
		return
	}
	if err := h.store.saveHelper(helperState{LastProfile: key.wire()}); err != nil {
		h.log.Warn("cannot save the last configured profile; after a restart, one-shot calls act on the default profile until a configure", "err", err)
	}
}

// Call runs one client method on the Service of its profile (see Helper).
// params is the raw JSON of the frame's "params" (may be nil). A nil result
// means a reply without "result". An unknown method fails with
// "Unknown method: <name>".
func (h *Helper) Call(ctx context.Context, method string, params json.RawMessage) (any, error) {
	if !protocol.IsKnownMethod(method) {
		return nil, protocol.UnknownMethodError(method)
	}
	var s *Service
	var err error
	if method == protocol.MethodConfigure {
		s, err = h.configureProfile(ctx, params)
	} else {
		s, err = h.serviceFor(ctx)
	}
	if err != nil {
		return nil, err
	}
	return s.Call(ctx, method, params)
}

// Handle implements protocol.Handler: it runs one client method.
func (h *Helper) Handle(ctx context.Context, method string, params json.RawMessage) (any, error) {
	return h.Call(ctx, method, params)
}

// Subscribe implements protocol.Handler for subscribeEvents: the events of
// the profile its params name (Service.Subscribe).
func (h *Helper) Subscribe(ctx context.Context, params json.RawMessage) (*protocol.Subscription, error) {
	p, err := protocol.DecodeParams[protocol.SubscribeEventsParams](protocol.MethodSubscribeEvents, params)
	if err != nil {
		return nil, err
	}
	s, err := h.Profile(p.UserDataName, p.UserDataRoot)
	if err != nil {
		return nil, fmt.Errorf("subscribeEvents: %w", err)
	}
	return s.Subscribe(ctx)
}

// SubscribeProfile opens a hub subscription for a profile's events: the
// caller handles every event Next returns, calling Ack after each.
func (h *Helper) SubscribeProfile(userDataName, userDataRoot string) (*Subscription, error) {
	s, err := h.Profile(userDataName, userDataRoot)
	if err != nil {
		return nil, err
	}
	return s.hub.Subscribe(), nil
}

// Close stops every profile's guest, as stopVM does, at once, and ends
// their egress connections. Calls on profiles already served still work
// afterwards (a stopped guest; the janitor), no new profile is served.
func (h *Helper) Close(ctx context.Context) error {
	h.mu.Lock()
	if !h.closed {
		close(h.stopWatch)
	}
	h.closed = true
	services := make([]*Service, 0, len(h.services))
	for _, s := range h.services {
		services = append(services, s)
	}
	h.mu.Unlock()
	errs := make([]error, len(services))
	var wg sync.WaitGroup
	for i, s := range services {
		wg.Go(func() { errs[i] = s.Close(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// WaitDelivered waits until every profile's live subscribers have taken
// every event published so far (those of a profile without a subscriber
// stay in its backlog), or ctx ends: after Close, so that the exits of the
// processes it ended reach the client before the connections close.
func (h *Helper) WaitDelivered(ctx context.Context) {
	h.mu.Lock()
	hubs := make([]*Hub, 0, len(h.services))
	for _, s := range h.services {
		hubs = append(hubs, s.hub)
	}
	h.mu.Unlock()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for _, hub := range hubs {
		for !hub.delivered() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}
}

// DataDir is where the helper keeps sessions and state.
func (h *Helper) DataDir() string { return h.opts.DataDir }

var _ protocol.Handler = (*Helper)(nil)
