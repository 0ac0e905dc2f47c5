package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/egress/fdpass"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// Name is the backend's name (helper.BackendProcess).
const Name = "process"

// DefaultStopGrace is how long Stop waits for the agent to exit by itself
// (after the helper's shutdown request, or after Stop closed its connection)
// before killing the sandbox.
const DefaultStopGrace = 5 * time.Second

// agentPath is the PATH the agent process gets; spawned processes get the env
// the helper gives them.
const agentPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options configures the backend. The zero value runs the helper's own
// executable as `<exe> agent --fd 3`.
type Options struct {
	// Executable is the binary holding the agent; default os.Executable().
	Executable string
	// Args are the agent-mode arguments; default ["agent", "--fd", "3",
	// "--egress-fd", "4"]. The connection is always passed as fd 3, the
	// egress socket (SOCK_SEQPACKET, see egress/fdpass) as fd 4.
	Args []string
	// Env is appended to the agent's minimal environment (PATH only).
	Env []string
	// Stderr receives the agent's log; default os.Stderr.
	Stderr io.Writer
	// StopGrace: see DefaultStopGrace.
	StopGrace time.Duration
	Logger    *slog.Logger
}

// Backend starts namespace sandboxes.
type Backend struct {
	opts Options
}

// New returns the process backend.
func New(opts Options) *Backend {
	if opts.Args == nil {
		opts.Args = []string{"agent", "--fd", "3", "--egress-fd", "4"}
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = DefaultStopGrace
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Backend{opts: opts}
}

var _ helper.Backend = (*Backend)(nil)

// Name implements helper.Backend.
func (b *Backend) Name() string { return Name }

// Start launches the agent in its namespaces. It returns once the process is
// running; the agent's hello is read by the caller from Agent's connection.
func (b *Backend) Start(ctx context.Context, cfg helper.GuestConfig) (helper.Guest, error) {
	step := cfg.StepFunc
	if step == nil {
		step = func(string, string) {}
	}
	step("sandbox", protocol.StepStarted)
	exe := b.opts.Executable
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("process backend: finding the helper's own executable to run the agent: %w", err)
		}
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("process backend: creating the agent's socket pair: %w", err)
	}
	agentEnd := os.NewFile(uintptr(fds[0]), "agent-end")
	helperEnd := os.NewFile(uintptr(fds[1]), "helper-end")
	defer agentEnd.Close()
	conn, err := net.FileConn(helperEnd)
	helperEnd.Close()
	if err != nil {
		return nil, fmt.Errorf("process backend: wrapping the agent's socket: %w", err)
	}

	// The egress socket: the agent (which has no network) hands the helper
	// one end of a fresh socketpair per outbound connection over it.
	efds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("process backend: creating the egress socket pair: %w", err)
	}
	agentEgress := os.NewFile(uintptr(efds[0]), "agent-egress")
	helperEgress := os.NewFile(uintptr(efds[1]), "helper-egress")
	defer agentEgress.Close()
	egressConn, err := net.FileConn(helperEgress)
	helperEgress.Close()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("process backend: wrapping the egress socket: %w", err)
	}
	egressUnix, ok := egressConn.(*net.UnixConn)
	if !ok {
		conn.Close()
		egressConn.Close()
		return nil, fmt.Errorf("process backend: the egress socket is a %T, not a Unix socket", egressConn)
	}

	cmd := exec.Command(exe, b.opts.Args...)
	cmd.Dir = "/"
	cmd.Env = append([]string{agentPath}, b.opts.Env...)
	cmd.ExtraFiles = []*os.File{agentEnd, agentEgress}
	cmd.Stdout = b.opts.Stderr
	cmd.Stderr = b.opts.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// CLONE_NEWNET: the sandbox has only a loopback that is down; its
		// processes reach out only through the egress socket (each spawn
		// in a namespace of its own, see guest/proxy).
		Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
		// Our uid/gid are root inside: the agent may mount, and what the
		// guest writes through rw mounts belongs to us on the host.
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
		Pdeathsig:                  unix.SIGKILL,
		// A session of its own, with no controlling terminal: the
		// terminal `cowork-vmm run` was started from is the user's, and
		// a process of the sandbox could otherwise open it (/dev/tty)
		// and queue input for the user's shell with TIOCSTI.
		Setsid: true,
	}
	if err := cmd.Start(); err != nil {
		conn.Close()
		egressConn.Close()
		return nil, fmt.Errorf("process backend: starting the agent in new user/mount/PID namespaces failed "+
			"(user namespaces may be disabled: check /proc/sys/kernel/unprivileged_userns_clone, "+
			"/proc/sys/user/max_user_namespaces and AppArmor's apparmor_restrict_unprivileged_userns): %w", err)
	}
	g := &guest{
		opts:   b.opts,
		cmd:    cmd,
		conn:   conn,
		egress: fdpass.NewListener(egressUnix),
		done:   make(chan struct{}),
	}
	go g.wait()
	b.opts.Logger.Info("process sandbox started", "pid", cmd.Process.Pid)
	step("sandbox", protocol.StepCompleted)
	return g, nil
}

// guest is one running sandbox.
type guest struct {
	opts Options
	cmd  *exec.Cmd
	conn net.Conn
	// egress yields the connections the agent passes (helper.Guest.Egress).
	egress *fdpass.Listener

	mu        sync.Mutex
	agentUsed bool
	stopping  bool
	err       error

	done     chan struct{}
	stopOnce sync.Once
	stopErr  error
}

// wait reaps the agent and records why it ended.
func (g *guest) wait() {
	err := g.cmd.Wait()
	g.mu.Lock()
	// Exit status 0 only follows the helper's shutdown request: a clean end.
	if !g.stopping && err != nil {
		g.err = fmt.Errorf("the sandbox agent ended unexpectedly: %w", err)
	}
	g.mu.Unlock()
	// The connection is not closed here: what the agent wrote before it
	// exited (its reply to the shutdown request, the last exit events)
	// may still be unread, and a reader of a closed connection loses it.
	// With the agent gone nothing holds its end, so a reader gets EOF
	// once it has read everything; Stop closes ours.
	g.egress.Close()
	close(g.done)
}

// Egress implements helper.Guest.Egress: the connections the agent's
// per-spawn proxies open, for the helper's egress server.
func (g *guest) Egress() net.Listener { return g.egress }

// Agent returns the raw connection to the agent, which is there from the
// start (a socketpair). The caller reads the agent's hello from it. It may be
// called once.
func (g *guest) Agent(ctx context.Context) (io.ReadWriteCloser, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.agentUsed {
		return nil, errors.New("process backend: the agent connection was already handed out")
	}
	select {
	case <-g.done:
		return nil, fmt.Errorf("process backend: %w", g.errLocked())
	default:
	}
	g.agentUsed = true
	return g.conn, nil
}

func (g *guest) errLocked() error {
	if g.err != nil {
		return g.err
	}
	return errors.New("the sandbox has stopped")
}

// Share returns a bind source: the agent resolves host paths through the host
// root it keeps, so any path the helper's user can reach may be shared.
// Read-only is applied by the agent (Mount.ReadOnly). For a regular file
// the source is the file's directory: the agent binds only the file
// (Mount.SourceFile), and spawned processes never see the rest.
func (g *guest) Share(hostPath string, readOnly bool) (protocol.MountSource, error) {
	if !filepath.IsAbs(hostPath) || filepath.Clean(hostPath) != hostPath {
		return protocol.MountSource{}, fmt.Errorf("process backend: share path %q must be absolute and clean", hostPath)
	}
	if fi, err := os.Stat(hostPath); err == nil && fi.Mode().IsRegular() {
		return protocol.MountSource{Kind: protocol.MountKindBind, Path: filepath.Dir(hostPath)}, nil
	}
	return protocol.MountSource{Kind: protocol.MountKindBind, Path: hostPath}, nil
}

// Unshare implements helper.Guest: nothing to withdraw. A bind source is
// a host path, not a handle; the agent's bind of it goes when the agent
// replaces the mount, and the sandbox's processes only ever reach what
// the agent bound.
func (g *guest) Unshare(protocol.MountSource) {}

func (g *guest) Done() <-chan struct{} { return g.done }

// Err says why the guest ended: nil after Stop, an error if the agent died.
func (g *guest) Err() error {
	select {
	case <-g.done:
	default:
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Stop ends the sandbox. The helper sends the agent's shutdown request first
// (to collect exit events); Stop then closes the connection (an agent that is
// still up treats that as a shutdown), waits up to StopGrace or ctx for the
// agent to exit, and otherwise kills it — as PID 1 of the sandbox's PID
// namespace its death ends every process in it. Safe to call more than once.
func (g *guest) Stop(ctx context.Context) error {
	g.stopOnce.Do(func() {
		g.mu.Lock()
		g.stopping = true
		g.mu.Unlock()
		g.conn.Close()
		grace := time.NewTimer(g.opts.StopGrace)
		defer grace.Stop()
		select {
		case <-g.done:
		case <-grace.C:
		case <-ctx.Done():
		}
		select {
		case <-g.done:
		default:
			g.opts.Logger.Warn("sandbox agent did not exit; killing the sandbox", "pid", g.cmd.Process.Pid)
			_ = g.cmd.Process.Kill()
			select {
			case <-g.done:
			case <-time.After(10 * time.Second):
				g.stopErr = errors.New("process backend: the sandbox agent did not die after SIGKILL")
				return
			}
		}
		g.mu.Lock()
		g.err = nil // a requested stop is a clean end
		g.mu.Unlock()
	})
	return g.stopErr
}
