package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/cowork-vmm/cowork-vmm/doctor"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// The client subcommand speaks the socket protocol to a running helper the
// way the desktop client does, so a session can be tried by hand.

const (
	// clientProfile is the userDataName the client configures and
	// subscribes with; the desktop client uses its own profile name.
	clientProfile = "cowork-vmm-client"
	// defaultClientSession is the session (guest home /sessions/<name>)
	// when --session is not given. It persists across calls, as a desktop
	// session does.
	defaultClientSession = "cowork-vmm-client"
	// clientCallTimeout is the desktop client's per-call timeout.
	clientCallTimeout = 30 * time.Second
	// clientPollInterval is how often isGuestConnected is polled ("several
	// times a second", as the desktop client does).
	clientPollInterval = 100 * time.Millisecond
)

// clientOptions are the client subcommand's flags.
type clientOptions struct {
	socket  string
	session string
	workdir string
	env     map[string]string
	mounts  map[string]protocol.AdditionalMount
	timeout time.Duration
	stopVM  bool
	command []string
	// bundle is the client's VM bundle directory (--bundle), absolute; ""
	// for none.
	bundle string
}

// defaultSocketPath is where the desktop client puts its socket, so where
// a helper it started listens: $XDG_RUNTIME_DIR/claude-cowork-vm.sock, or
// with XDG_RUNTIME_DIR unset the client's fallback <tmpdir>/claude-cowork-<uid>/
// (CLIENT-FACTS.md; doctor checks the same place).
func defaultSocketPath(getenv func(string) string, uid int) string {
	dir, _ := doctor.SocketDir(getenv, uid)
	return filepath.Join(dir, doctor.SocketName)
}

func clientUsage(w io.Writer, defaultSocket string) {
	fmt.Fprintf(w, `Usage: cowork-vmm client [flags] -- CMD [ARG…]

Runs CMD in a session of a running helper (cowork-vmm -socket PATH), through
its socket, the way Claude Desktop does: it subscribes to events, starts the
guest unless one is running, waits for the guest agent, spawns CMD in the
session, prints its stdout and stderr, forwards stdin (its end too) and
Ctrl-C (a second Ctrl-C stops waiting for a command that does not end), and
exits with CMD's status (128+n when signal n ended it). The guest is left
running for the next call unless --stop-vm is given.

Flags:
  --socket PATH            the helper's socket (default %s)
  --session NAME           the session: its home is /sessions/NAME in the guest and
                           persists across calls (default %s)
  --mount HOST:NAME[:ro]   share the host directory HOST at /sessions/<session>/mnt/NAME
                           (repeatable; ":ro" for read-only; a missing HOST is created
                           unless read-only)
  --env KEY=VALUE          set an environment variable (repeatable)
  --workdir PATH           guest working directory (default /sessions/<session>)
  --timeout D              how long to wait for the guest to come up (default %s)
  --stop-vm                stop the guest after CMD exits
  --bundle DIR             start the guest on the client's VM bundle DIR (its rootfs.img
                           as the guest's userland, kvm backend), as Claude Desktop does

Example:
  COWORK_VMM_BACKEND=process cowork-vmm -socket "$XDG_RUNTIME_DIR/claude-cowork-vm.sock" &
  cowork-vmm client -- uname -a
  cowork-vmm client --mount "$PWD:work" --workdir /sessions/%s/mnt/work -- ls -la
`, defaultSocket, defaultClientSession, bootTimeout, defaultClientSession)
}

// parseClientMount parses HOST:NAME[:ro|:rw] into a mount name and its
// additionalMounts entry (a host path relative to "/").
func parseClientMount(s string) (string, protocol.AdditionalMount, error) {
	parts := strings.Split(s, ":")
	m := protocol.AdditionalMount{Mode: protocol.MountModeRW}
	switch {
	case len(parts) == 2:
	case len(parts) == 3 && parts[2] == "ro":
		m.Mode = protocol.MountModeRO
	case len(parts) == 3 && parts[2] == "rw":
	default:
		return "", m, fmt.Errorf("--mount %q: want HOST:NAME or HOST:NAME:ro", s)
	}
	host, name := parts[0], parts[1]
	if host == "" {
		return "", m, fmt.Errorf("--mount %q: HOST is empty", s)
	}
	if name == "" || path.IsAbs(name) || path.Clean(name) != name || name == "." || strings.HasPrefix(name, "../") || name == ".." {
		return "", m, fmt.Errorf("--mount %q: NAME must be a relative name such as work or a/b; it appears at /sessions/<session>/mnt/NAME in the guest", s)
	}
	abs, err := filepath.Abs(host)
	if err != nil {
		return "", m, fmt.Errorf("--mount %q: %w", s, err)
	}
	m.Path = strings.TrimPrefix(abs, "/")
	return name, m, nil
}

// parseClientArgs parses the flags; err is flag.ErrHelp for -h.
func parseClientArgs(args []string, stderr io.Writer, defaultSocket string) (clientOptions, error) {
	o := clientOptions{env: map[string]string{}, mounts: map[string]protocol.AdditionalMount{}}
	flags := flagSet("cowork-vmm client", stderr)
	flags.StringVar(&o.socket, "socket", defaultSocket, "the helper's socket `path`")
	flags.StringVar(&o.session, "session", defaultClientSession, "session `name`")
	flags.StringVar(&o.workdir, "workdir", "", "guest working directory")
	flags.DurationVar(&o.timeout, "timeout", bootTimeout, "how long to wait for the guest")
	flags.BoolVar(&o.stopVM, "stop-vm", false, "stop the guest after the command")
	flags.StringVar(&o.bundle, "bundle", "", "the client's VM bundle `dir`")
	flags.Var(listFlag{func(s string) error {
		name, m, err := parseClientMount(s)
		if err != nil {
			return err
		}
		if _, dup := o.mounts[name]; dup {
			return fmt.Errorf("--mount %q: NAME %q is given twice", s, name)
		}
		o.mounts[name] = m
		return nil
	}}, "mount", "share HOST:NAME[:ro] (repeatable)")
	flags.Var(envFlag(o.env), "env", "set KEY=VALUE (repeatable)")
	flags.Usage = func() { clientUsage(stderr, defaultSocket) }
	if err := flags.Parse(args); err != nil {
		return o, err
	}
	o.command = flags.Args()
	if o.bundle != "" {
		abs, err := filepath.Abs(o.bundle)
		if err != nil {
			return o, fmt.Errorf("client: --bundle: %w", err)
		}
		o.bundle = abs
	}
	switch {
	case len(o.command) == 0:
		return o, errors.New("client: no command given (cowork-vmm client [flags] -- CMD [ARG…])")
	case o.socket == "":
		return o, errors.New("client: --socket is empty")
	case o.session == "":
		return o, errors.New("client: --session is empty")
	case o.timeout <= 0:
		return o, fmt.Errorf("client: --timeout %v must be positive", o.timeout)
	case o.workdir != "" && !path.IsAbs(o.workdir):
		return o, fmt.Errorf("client: --workdir %q must be an absolute guest path", o.workdir)
	}
	return o, nil
}

// clientMain is `cowork-vmm client`.
func clientMain(args []string, stdout, stderr io.Writer) int {
	defaultSocket := defaultSocketPath(os.Getenv, os.Getuid())
	o, err := parseClientArgs(args, stderr, defaultSocket)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	code, err := runClient(context.Background(), o, clientIO{stdin: os.Stdin, stdout: stdout, stderr: stderr, signals: sigs})
	if err != nil {
		fmt.Fprintln(stderr, "cowork-vmm client:", err)
	}
	return code
}

// clientIO is the terminal side of a client run. stdin and signals may be
// nil (nothing forwarded).
type clientIO struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	signals        <-chan os.Signal
}

// dialError turns a failure to reach the socket into advice.
func dialError(socket string, err error) error {
	start := fmt.Sprintf("start one with `cowork-vmm -socket %s` (COWORK_VMM_BACKEND=process on a host without KVM)", socket)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("no helper listening at %s; %s", socket, start)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("no helper listening at %s (the socket is left over from one that exited); %s", socket, start)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("cannot reach %s: %w (the helper serves only the user it runs as; run the client as that user)", socket, err)
	}
	return fmt.Errorf("cannot reach the helper at %s: %w", socket, err)
}

// runClient runs o.command through the helper at o.socket and returns its
// exit status; err says why when the command could not run to its end. It
// follows the desktop client's order: configure the pipe, subscribe
// (before anything that makes events), boot, spawn.
func runClient(ctx context.Context, o clientOptions, tio clientIO) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &clientSession{o: o, tio: tio, ctx: ctx, cancel: cancel, spawning: make(chan struct{}), spawnedID: make(chan string, 1)}
	if err := r.dial(); err != nil {
		return 1, err
	}
	defer r.pipe.Close()
	r.watchSignals()
	if err := r.subscribe(); err != nil {
		return r.failed(err)
	}
	defer r.stream.Close()
	stopStream := context.AfterFunc(ctx, func() { _ = r.stream.Close() })
	defer stopStream()
	if err := r.boot(); err != nil {
		return r.failed(err)
	}
	if o.stopVM {
		defer r.stopGuest()
	}
	procID, code, err := r.spawn()
	if err != nil {
		return code, err
	}
	r.spawnedID <- procID
	if tio.stdin != nil {
		go forwardClientStdin(ctx, r.pipe, procID, tio.stdin)
	}
	code, err = streamProcess(r.stream, procID, tio)
	if n := r.gaveUp.Load(); n != 0 {
		return int(n), errors.New("gave up waiting after a second signal: the command did not end and may still run in the guest (stopVM ends it)")
	}
	return code, err
}

// clientSession is one runClient: the pipe, the event stream and what the
// signal handler has seen.
type clientSession struct {
	o      clientOptions
	tio    clientIO
	ctx    context.Context
	cancel context.CancelFunc
	pipe   *protocol.PipeClient
	stream *protocol.EventStream
	// A signal before the command runs abandons the call; after, it is
	// forwarded to the command (spawnedID orders the two).
	spawning    chan struct{}
	spawnedID   chan string
	interrupted atomic.Bool
	gaveUp      atomic.Int32 // the exit status after a second signal, 0 before
}

// dial checks that o.socket is a socket and opens the pipe.
func (r *clientSession) dial() error {
	if info, err := os.Lstat(r.o.socket); err != nil {
		return dialError(r.o.socket, err)
	} else if info.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s is not a socket (%v); point --socket at the path the helper was started with (cowork-vmm -socket PATH)", r.o.socket, info.Mode().Type())
	}
	pipe, err := protocol.DialPipe(r.ctx, r.o.socket)
	if err != nil {
		return dialError(r.o.socket, err)
	}
	r.pipe = pipe
	return nil
}

func (r *clientSession) call(method string, params, result any) error {
	ctx, cancel := context.WithTimeout(r.ctx, clientCallTimeout)
	defer cancel()
	return r.pipe.CallResult(ctx, method, params, result)
}

// watchSignals starts the signal handler, if there are signals to watch.
func (r *clientSession) watchSignals() {
	if r.tio.signals == nil {
		return
	}
	go handleClientSignals(r.ctx, r.pipe, r.tio.signals, r.spawning, r.spawnedID, func() {
		r.interrupted.Store(true)
		r.cancel()
	}, func(sig os.Signal) {
		// stream is set before the spawn, which happens before any
		// forwarded signal.
		r.gaveUp.Store(int32(128 + signalNumber(signalNames[sig])))
		r.stream.Close()
	})
}

// failed is the exit for an error before the command ran.
func (r *clientSession) failed(err error) (int, error) {
	if r.interrupted.Load() {
		return 130, errors.New("interrupted before the command started")
	}
	return 1, err
}

// subscribe configures the pipe and subscribes to the events.
func (r *clientSession) subscribe() error {
	if err := r.call(protocol.MethodConfigure, protocol.ConfigureParams{UserDataName: clientProfile, SessionOnly: true}, nil); err != nil {
		return fmt.Errorf("the helper at %s refused the connection: %w", r.o.socket, err)
	}
	ctx, cancel := context.WithTimeout(r.ctx, clientCallTimeout)
	defer cancel()
	stream, err := protocol.SubscribeEvents(ctx, r.o.socket, protocol.SubscribeEventsParams{UserDataName: clientProfile})
	if err != nil {
		return fmt.Errorf("subscribing to the helper's events: %w", err)
	}
	r.stream = stream
	return nil
}

// boot starts the guest unless it runs and waits for its agent.
func (r *clientSession) boot() error {
	ctx, cancel := context.WithTimeout(r.ctx, r.o.timeout)
	defer cancel()
	if _, err := protocol.StartGuest(ctx, r.pipe, protocol.ConfigureParams{UserDataName: clientProfile}, protocol.StartVMParams{BundlePath: r.o.bundle}); err != nil {
		return fmt.Errorf("starting the guest: %w", err)
	}
	err := protocol.WaitGuestConnected(ctx, r.pipe, clientPollInterval)
	switch {
	case err == nil || r.interrupted.Load():
		return err
	case errors.Is(err, context.DeadlineExceeded) && r.ctx.Err() == nil:
		return fmt.Errorf("the guest did not come up within %v (--timeout); the helper's log says why, and `cowork-vmm doctor` checks the host", r.o.timeout)
	case errors.Is(err, protocol.ErrGuestStopped):
		return fmt.Errorf("%w; the helper's log says why, and `cowork-vmm doctor` checks the host", err)
	}
	return err
}

// stopGuest stops the guest (--stop-vm), whatever happened before.
func (r *clientSession) stopGuest() {
	ctx, cancel := context.WithTimeout(context.Background(), clientCallTimeout)
	defer cancel()
	if err := r.pipe.CallResult(ctx, protocol.MethodStopVM, nil, nil); err != nil {
		fmt.Fprintln(r.tio.stderr, "cowork-vmm client: stopping the guest:", err)
	}
}

// spawn starts the command; on failure code is the exit status to give.
func (r *clientSession) spawn() (procID string, code int, err error) {
	procID, err = newClientProcessID()
	if err != nil {
		return "", 1, err
	}
	spawn := protocol.ClientSpawnParams{
		ID: procID, Name: r.o.session, Command: r.o.command[0], Args: r.o.command[1:],
		Cwd: r.o.workdir, Env: r.o.env, AdditionalMounts: r.o.mounts,
	}
	if spawn.Args == nil {
		spawn.Args = []string{} // the desktop client always sends the array
	}
	var spawned protocol.SpawnResult
	close(r.spawning)
	if err := r.call(protocol.MethodSpawn, spawn, &spawned); err != nil {
		if r.interrupted.Load() {
			code, err := r.failed(err)
			return "", code, err
		}
		return "", 127, err
	}
	for _, name := range spawned.FailedMounts {
		fmt.Fprintf(r.tio.stderr, "cowork-vmm client: --mount %s could not be made (the helper's log says why); the command runs without it\n", name)
	}
	return procID, 0, nil
}

// streamProcess writes the process's output as its events arrive and
// returns its exit status once its exit event comes.
func streamProcess(stream *protocol.EventStream, procID string, tio clientIO) (int, error) {
	for {
		ev, err := stream.Next()
		if err != nil {
			return 1, fmt.Errorf("the helper ended the event stream before the command exited (is it still running? its log says why): %w", err)
		}
		switch {
		case ev.Type == protocol.EventError && ev.ID == "" && ev.Fatal != nil && *ev.Fatal:
			fmt.Fprintln(tio.stderr, "cowork-vmm client: the guest failed:", ev.Message)
		case ev.ID != procID:
			// Another process's event, or one of the helper's own.
		case ev.Type == protocol.EventStdout:
			_, _ = io.WriteString(tio.stdout, ev.Data)
		case ev.Type == protocol.EventStderr:
			_, _ = io.WriteString(tio.stderr, ev.Data)
		case ev.Type == protocol.EventError:
			fmt.Fprintln(tio.stderr, "cowork-vmm client:", ev.Message)
		case ev.Type == protocol.EventExit:
			switch {
			case ev.Signal != "":
				return 128 + signalNumber(ev.Signal), nil
			case ev.ExitCode != nil:
				return *ev.ExitCode, nil
			}
			return 0, nil
		}
	}
}

// newClientProcessID returns a spawn id no other call uses, so the events
// of earlier runs (the helper replays a backlog) are never taken for ours.
func newClientProcessID() (string, error) {
	var tag [8]byte
	if _, err := rand.Read(tag[:]); err != nil {
		return "", fmt.Errorf("choosing a process id: %w", err)
	}
	return "client-" + hex.EncodeToString(tag[:]), nil
}

// signalNames are the signals the client forwards, by their protocol names.
var signalNames = map[os.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGHUP: "SIGHUP"}

// handleClientSignals calls abandon on a signal that arrives before
// spawning is closed (the guest is still coming up). Once it is, signals go
// to the command, whose id comes on spawned when the spawn has succeeded;
// a second one calls giveUp instead, so a command (or a guest) that does
// not end cannot hold the terminal.
func handleClientSignals(ctx context.Context, pipe *protocol.PipeClient, sigs <-chan os.Signal, spawning <-chan struct{}, spawned <-chan string, abandon func(), giveUp func(os.Signal)) {
	names := signalNames
	id := ""
	forwarded := 0
	for {
		var sig os.Signal
		select {
		case <-ctx.Done():
			return
		case sig = <-sigs:
		}
		name, ok := names[sig]
		if !ok {
			continue
		}
		if id == "" {
			select {
			case <-spawning:
			default:
				abandon()
				return
			}
			select { // the spawn is in flight: the signal is for its process
			case id = <-spawned:
			case <-ctx.Done():
				return
			}
		}
		if forwarded++; forwarded > 1 {
			giveUp(sig)
			return
		}
		callCtx, cancel := context.WithTimeout(ctx, clientCallTimeout)
		_ = pipe.CallResult(callCtx, protocol.MethodKill, protocol.ClientKillParams{ID: id, Signal: name}, nil)
		cancel()
	}
}

// forwardClientStdin copies stdin to the process with writeStdin, and its
// end with writeStdin's eof (our extension: the desktop client never ends
// a process's input). A UTF-8 sequence split by a read is held back until
// it is whole (writeStdin data is a JSON string).
func forwardClientStdin(ctx context.Context, pipe *protocol.PipeClient, id string, stdin io.Reader) {
	buf := make([]byte, 32*1024)
	held := 0
	for {
		n, err := stdin.Read(buf[held:])
		n += held
		send := n
		if err == nil {
			send = completeUTF8(buf[:n])
		}
		eof := errors.Is(err, io.EOF)
		if send > 0 || eof {
			callCtx, cancel := context.WithTimeout(ctx, clientCallTimeout)
			werr := pipe.CallResult(callCtx, protocol.MethodWriteStdin, protocol.WriteStdinParams{ID: id, Data: string(buf[:send]), EOF: eof}, nil)
			cancel()
			if werr != nil {
				return
			}
		}
		held = copy(buf, buf[send:n])
		if err != nil {
			return
		}
	}
}

// completeUTF8 returns how much of b can be sent without splitting a UTF-8
// sequence: all of it, except an incomplete sequence at its end.
func completeUTF8(b []byte) int {
	for back := 1; back < utf8.UTFMax && back <= len(b); back++ {
		c := b[len(b)-back]
		if !utf8.RuneStart(c) {
			continue
		}
		if !utf8.FullRune(b[len(b)-back:]) {
			return len(b) - back
		}
		break
	}
	return len(b)
}
