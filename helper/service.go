package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/egress/probe"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Backend names.
const (
	BackendKVM     = "kvm"
	BackendProcess = "process"
)

// DefaultSystemDirs are the host directories every guest sees read-only
// (those that exist on the host).
var DefaultSystemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"}

// Guest sizes before configure or startVM give one.
const (
	defaultMemoryMB = 4096
	defaultCPUCount = 2
)

// Options configure a Helper.
type Options struct {
	// Backend is the backend name startVM uses ("" means BackendKVM).
	Backend string
	// Backends maps backend names to their factories. A name without a
	// factory makes startVM fail with an error naming the alternatives.
	Backends map[string]BackendFactory
	// FallbackHint ends the error of a failed start (Backend not in this
	// build, unavailable, or its guest not launching) when another backend
	// could serve instead, unless the error already names one; "" for
	// none. The binary, which chose Backend by name, sets it.
	FallbackHint string
	// DataDir holds the helper's data: sessions and state (see state.go).
	// Empty means DefaultDataDir().
	DataDir string
	// Stateless keeps no state in DataDir and reads none (the run
	// subcommand): no helper.json or profile.json, and no profile takes
	// DataDir/sessions.
	Stateless bool
	// Logger receives one line per notable event; nil discards.
	Logger *slog.Logger
	// LogLevel is switched by setDebugLogging; may be nil.
	LogLevel *slog.LevelVar
	// OnDebugLogging is also called by setDebugLogging (e.g. to turn on the
	// socket server's per-frame logging); may be nil.
	OnDebugLogging func(enabled bool)
	// Backlog is how many events of a profile a late subscriber can catch
	// up on.
	Backlog int
	// StopGrace is how long processes get between SIGTERM and SIGKILL on
	// stopVM (default 5 s).
	StopGrace time.Duration
	// PingInterval is how often a connected agent is pinged (default 2 s).
	// A ping unanswered within 5 intervals fails (also one the guest does
	// not read: the write is bounded too); pingFailuresFatal failures
	// in a row declare the guest dead. Until then isGuestConnected stays
	// true: one slow ping is not a dead guest.
	PingInterval time.Duration
	// SystemDirs override DefaultSystemDirs (tests).
	SystemDirs []string
	// NetworkCheck overrides the networkStatus check (tests); default
	// probe.NetworkChecker (a default route, and apiProbeURL's host
	// resolves).
	NetworkCheck func(ctx context.Context) string
	// ProbeClient overrides the client of the apiProbeURL HEAD (tests);
	// default probe.NewHTTPClient through the egress server.
	ProbeClient probe.HTTPDoer
	// EgressTestHosts is the value of EgressTestHostsEnv (tests only; see
	// there). Empty in production.
	EgressTestHosts string
	// EgressAllowPrivate lets guests reach the private ranges
	// (egress.Config.AllowPrivate; the binary reads egress.AllowPrivateEnv).
	EgressAllowPrivate bool
	// EgressProxy is the host's proxy setting that egress dials through
	// (egress.UpstreamProxyFromEnv); nil dials directly.
	EgressProxy *egress.UpstreamProxy
	// MemInfo is the host's meminfo file the memory watch reads (default
	// /proc/meminfo; memwatch.go), MemoryPoll how often (default 5 s).
	MemInfo    string
	MemoryPoll time.Duration
}

// withDefaults fills in what opts leaves out.
func (opts Options) withDefaults() (Options, error) {
	if opts.Backend == "" {
		opts.Backend = BackendKVM
	}
	if opts.DataDir == "" {
		d, err := DefaultDataDir()
		if err != nil {
			return opts, err
		}
		opts.DataDir = d
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = 5 * time.Second
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = 2 * time.Second
	}
	if opts.MemInfo == "" {
		opts.MemInfo = "/proc/meminfo"
	}
	if opts.MemoryPoll <= 0 {
		opts.MemoryPoll = defaultMemoryPoll
	}
	if opts.SystemDirs == nil {
		opts.SystemDirs = DefaultSystemDirs
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return opts, nil
}

// DefaultDataDir is $XDG_DATA_HOME/cowork-vmm, or ~/.local/share/cowork-vmm.
func DefaultDataDir() (string, error) {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "cowork-vmm"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("finding the data directory: set XDG_DATA_HOME or HOME: %w", err)
	}
	return filepath.Join(home, ".local", "share", "cowork-vmm"), nil
}

// Service is one profile's helper: its guest (at most one, from startVM
// to its end), its processes, its sessions directory and their sizes
// against its disk quota, its SDK and approved token, and its events (a
// Hub of its own: no other profile's subscriber sees them). Every client
// method but subscribeEvents runs on a Service; the Helper picks which.
// It is safe for concurrent use.
type Service struct {
	h           *Helper
	key         profileKey
	opts        Options
	log         *slog.Logger
	hub         *Hub
	sessionsDir string
	methods     map[string]func(context.Context, json.RawMessage) (any, error)
	// egressReg holds each live spawn's allowedDomains and egress token;
	// egressSrv serves this profile's guest's egress connections against
	// it (per profile, so that two profiles may use the same spawn ids).
	egressReg *egress.Registry
	egressSrv *egress.Server
	testHosts *testHosts // EgressTestHostsEnv, nil in production
	sizes     *sizeCache // the sessions' sizes (disksize.go)

	// persistMu serialises profile.json writes (state.go): each writes a
	// snapshot taken while it is held, so the last write has the last state.
	persistMu sync.Mutex

	mu         sync.Mutex
	memoryMB   int
	cpuCount   int
	diskQuota  int64 // bytes; 0: none (getSessionsDiskInfo reports the filesystem)
	ownsData   bool  // the sessions are DataDir/sessions (saved with the state)
	oauthToken string
	sdk        *sdkInstall
	guest      *guestInstance // nil when no guest is starting or running
	// bundleNoted is the last bundlePath whose not being booted was logged.
	bundleNoted string
	procs       processTable
	// innerMounts records, per session, every mount target below its home
	// that a guest of this profile mounted (mnt/<name>, …): readFile never
	// reads those paths from the host directory, which they shadow.
	innerMounts map[string]map[string]bool
}

// newService makes the Service of a profile from its saved state ps.
func newService(h *Helper, key profileKey, ps profileState, sessionsDir string) *Service {
	opts := h.opts
	log := h.log.With("profile", key.name)
	s := &Service{
		h:           h,
		key:         key,
		opts:        opts,
		log:         log,
		hub:         NewHub(opts.Backlog, log),
		sessionsDir: sessionsDir,
		egressReg:   egress.NewRegistry(),
		testHosts:   h.testHosts,
		memoryMB:    defaultMemoryMB,
		cpuCount:    defaultCPUCount,
		innerMounts: map[string]map[string]bool{},
	}
	s.hub.onDelivered = s.outputDelivered
	s.egressSrv = newEgressServer(opts, h.testHosts, s.egressReg, log)
	s.procs.init()
	s.restore(ps)
	s.sizes = newSizeCache(s.measureSession, log)
	s.sizes.prime(s.listSessions)
	s.methods = map[string]func(context.Context, json.RawMessage) (any, error){
		protocol.MethodConfigure:             handler(s.configure),
		protocol.MethodSubscribeEvents:       handler(s.subscribeEventsCall),
		protocol.MethodCreateVM:              handler(s.createVM),
		protocol.MethodStartVM:               handler(s.startVM),
		protocol.MethodStopVM:                handler(s.stopVMCall),
		protocol.MethodIsRunning:             handler(s.isRunning),
		protocol.MethodIsGuestConnected:      handler(s.isGuestConnected),
		protocol.MethodSpawn:                 handler(s.spawn),
		protocol.MethodKill:                  handler(s.kill),
		protocol.MethodWriteStdin:            handler(s.writeStdin),
		protocol.MethodIsProcessRunning:      handler(s.isProcessRunning),
		protocol.MethodSendGuestResponse:     handler(s.sendGuestResponse),
		protocol.MethodSetDebugLogging:       handler(s.setDebugLogging),
		protocol.MethodMountPath:             handler(s.mountPath),
		protocol.MethodReadFile:              handler(s.readFile),
		protocol.MethodGetSessionsDiskInfo:   handler(s.getSessionsDiskInfo),
		protocol.MethodDeleteSessionDirs:     handler(s.deleteSessionDirs),
		protocol.MethodPruneSessionCaches:    handler(s.pruneSessionCaches),
		protocol.MethodInstallSdk:            handler(s.installSdk),
		protocol.MethodAddApprovedOauthToken: handler(s.addApprovedOauthToken),
		protocol.MethodGetNetworkDrives:      handler(s.getNetworkDrives),
	}
	return s
}

// handler adapts a typed method to the generic dispatch signature.
func handler[P, R any](f func(context.Context, P) (R, error)) func(context.Context, json.RawMessage) (any, error) {
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var p P
		if len(raw) > 0 && string(raw) != "null" {
			if err := json.Unmarshal(raw, &p); err != nil {
				return nil, fmt.Errorf("invalid params: %w", err)
			}
		}
		r, err := f(ctx, p)
		if err != nil {
			return nil, err
		}
		var res any = r
		if e, ok := res.(empty); ok && e == nil {
			return nil, nil // a reply without "result"
		}
		return res, nil
	}
}

// Methods lists the method names Call understands, sorted.
func (s *Service) Methods() []string {
	names := make([]string, 0, len(s.methods))
	for n := range s.methods {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Call runs one client method on this profile (configure's profile names
// are the Helper's business: here it sets the sizing only). params is the
// raw JSON of the frame's "params" (may be nil). A nil result means a reply
// without "result". An unknown method fails with "Unknown method: <name>".
func (s *Service) Call(ctx context.Context, method string, params json.RawMessage) (any, error) {
	h, ok := s.methods[method]
	if !ok {
		return nil, protocol.UnknownMethodError(method)
	}
	start := time.Now()
	res, err := h(ctx, params)
	if err != nil {
		s.log.Debug("call failed", "method", method, "err", err, "took", time.Since(start))
	} else {
		s.log.Debug("call", "method", method, "took", time.Since(start))
	}
	return res, err
}

// Subscribe is subscribeEvents for this profile, for the socket server:
// events are handed over an unbuffered channel, one at a time; one is
// acknowledged (see Hub) once the server says it has been written
// (Subscription.Delivered), so after a drop the profile's next
// subscription resumes with the event whose write failed.
func (s *Service) Subscribe(context.Context) (*protocol.Subscription, error) {
	sub := s.hub.Subscribe()
	s.log.Info("event subscriber connected")
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan protocol.Event)
	// written carries the server's word that the event handed over has
	// been written; only then is it acknowledged (and the next one taken),
	// so an event whose write failed goes to the next subscriber.
	written := make(chan struct{}, 1)
	producerDone := make(chan struct{})
	go func() {
		defer close(producerDone)
		for {
			ev, err := sub.Next(ctx)
			if err != nil {
				return
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
			select {
			case <-written:
				sub.Ack()
			case <-ctx.Done():
				// Delivered runs before Cancel on the server's goroutine:
				// an event written just before the end is still counted.
				select {
				case <-written:
					sub.Ack()
				default:
				}
				return
			}
		}
	}()
	return &protocol.Subscription{Events: events,
		Delivered: func() {
			select {
			case written <- struct{}{}:
			default:
			}
		},
		Cancel: func() {
			cancel()
			<-producerDone
			sub.Close()
			s.log.Info("event subscriber disconnected")
		}}, nil
}

// Events opens a subscription to this profile's events (in-process
// callers, such as the run subcommand): handle every event Next returns,
// calling Ack after each, and Close it when done.
func (s *Service) Events() *Subscription { return s.hub.Subscribe() }

// Publish sends an event to this profile's subscribers (for backends and
// later features such as the egress proxy).
func (s *Service) Publish(ev protocol.Event) { s.hub.Publish(ev) }

// Close stops the guest, if any, as stopVM does, ends every egress
// connection and the size measurements. Calls that need no guest still
// work afterwards (the janitor, readFile from the host).
func (s *Service) Close(ctx context.Context) error {
	err := s.stopVM(ctx)
	s.egressSrv.Close()
	s.sizes.close()
	return err
}

// SessionDir is the host directory of a session.
func (s *Service) SessionDir(name string) (string, error) {
	if err := validateSessionName(name); err != nil {
		return "", err
	}
	return filepath.Join(s.sessionsDir, name), nil
}

type empty = *struct{}

// configure sets the profile's guest sizing (the pipe variant,
// sessionOnly, sets nothing here: its profile is the Helper's business).
func (s *Service) configure(_ context.Context, p protocol.ConfigureParams) (empty, error) {
	if p.SessionOnly {
		return nil, nil
	}
	s.mu.Lock()
	if p.MemoryMB != nil && *p.MemoryMB > 0 && *p.MemoryMB < 1<<30 {
		s.memoryMB = int(*p.MemoryMB)
	}
	if p.CPUCount != nil && *p.CPUCount > 0 && *p.CPUCount < 1<<16 {
		s.cpuCount = int(*p.CPUCount)
	}
	mem, cpus := s.memoryMB, s.cpuCount
	s.mu.Unlock()
	s.log.Info("configured", "memoryMB", mem, "cpus", cpus)
	s.persist()
	return nil, nil
}

func (s *Service) subscribeEventsCall(context.Context, struct{}) (empty, error) {
	return nil, errors.New("subscribeEvents must be the first frame of its own connection")
}

// maxDiskSizeGB bounds createVM's diskSizeGB (a petabyte and more is a
// mistake, not a quota).
const maxDiskSizeGB = 1 << 20

// createVM sets the profile's disk quota: diskSizeGB GiB for its sessions
// together (getSessionsDiskInfo reports against it). There is no disk image
// to create: the guest's root is built from the host's system directories,
// and sessions are host directories. An absent or zero diskSizeGB leaves
// the quota as it was.
func (s *Service) createVM(_ context.Context, p protocol.CreateVMParams) (empty, error) {
	if p.DiskSizeGB < 0 || p.DiskSizeGB > maxDiskSizeGB {
		return nil, fmt.Errorf("createVM: diskSizeGB %v is out of range (0 to %d)", p.DiskSizeGB, maxDiskSizeGB)
	}
	if p.DiskSizeGB == 0 {
		return nil, nil
	}
	quota := int64(p.DiskSizeGB * (1 << 30))
	s.mu.Lock()
	changed := s.diskQuota != quota
	s.diskQuota = quota
	s.mu.Unlock()
	if changed {
		s.log.Info("disk quota", "diskSizeGB", p.DiskSizeGB, "bytes", quota)
		s.persist()
	}
	return nil, nil
}

func (s *Service) isRunning(context.Context, struct{}) (protocol.IsRunningResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return protocol.IsRunningResult{Running: s.guest != nil}, nil
}

func (s *Service) isGuestConnected(context.Context, struct{}) (protocol.IsGuestConnectedResult, error) {
	s.mu.Lock()
	inst := s.guest
	s.mu.Unlock()
	return protocol.IsGuestConnectedResult{Connected: inst != nil && inst.connected.Load()}, nil
}

func (s *Service) setDebugLogging(_ context.Context, p protocol.SetDebugLoggingParams) (empty, error) {
	if s.opts.LogLevel != nil {
		if p.Enabled {
			s.opts.LogLevel.Set(slog.LevelDebug)
		} else {
			s.opts.LogLevel.Set(slog.LevelInfo)
		}
	}
	if s.opts.OnDebugLogging != nil {
		s.opts.OnDebugLogging(p.Enabled)
	}
	s.log.Info("debug logging", "enabled", p.Enabled)
	return nil, nil
}

func (s *Service) addApprovedOauthToken(_ context.Context, p protocol.AddApprovedOauthTokenParams) (empty, error) {
	if strings.ContainsRune(p.Token, 0) {
		return nil, errors.New("addApprovedOauthToken: token contains a NUL byte")
	}
	s.mu.Lock()
	s.oauthToken = p.Token
	s.mu.Unlock()
	s.log.Info("OAuth token approved")
	s.persist()
	return nil, nil
}

func (s *Service) getNetworkDrives(context.Context, struct{}) (protocol.NetworkDrivesResult, error) {
	return protocol.NetworkDrivesResult{}, nil
}
