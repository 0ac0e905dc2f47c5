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
session, prints its stdout and stderr, forwards stdin and Ctrl-C (a second
Ctrl-C stops waiting for a command that does not end), and exits with CMD's
status (128+n when signal n ended it). The guest is left running for the
next call unless --stop-vm is given.

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
// exit status; err says why when the command could not run to its end.
func runClient(ctx context.Context, o clientOptions, tio clientIO) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	if info, err := os.Lstat(o.socket); err != nil {
		return 1, dialError(o.socket, err)
	} else if info.Mode()&fs.ModeSocket == 0 {
		return 1, fmt.Errorf("%s is not a socket (%v); point --socket at the path the helper was started with (cowork-vmm -socket PATH)", o.socket, info.Mode().Type())
	}
	pipe, err := protocol.DialPipe(ctx, o.socket)
	if err != nil {
		return 1, dialError(o.socket, err)
	}
	defer pipe.Close()
	call := func(method string, params, result any) error {
		callCtx, cancel := context.WithTimeout(ctx, clientCallTimeout)
		defer cancel()
		return pipe.CallResult(callCtx, method, params, result)
	}
	// A signal before the command runs abandons the call; after, it is
	// forwarded to the command.
	spawning, spawnedID := make(chan struct{}), make(chan string, 1)
	var interrupted atomic.Bool
	var gaveUp atomic.Int32 // the exit status after a second signal, 0 before
	var stream *protocol.EventStream
	if tio.signals != nil {
		go handleClientSignals(ctx, pipe, tio.signals, spawning, spawnedID, func() {
			interrupted.Store(true)
			cancel()
		}, func(sig os.Signal) {
			// stream is set before the spawn, which happens before any
			// forwarded signal (spawnedID orders them).
			gaveUp.Store(int32(128 + signalNumber(signalNames[sig])))
			stream.Close()
		})
	}
	wasInterrupted := func(err error) (int, error) {
		if interrupted.Load() {
			return 130, errors.New("interrupted before the command started")
		}
		return 1, err
	}

	// The desktop client's order: configure the pipe, subscribe (before
	// anything that makes events), boot, spawn.
	if err := call(protocol.MethodConfigure, protocol.ConfigureParams{UserDataName: clientProfile, SessionOnly: true}, nil); err != nil {
		return wasInterrupted(fmt.Errorf("the helper at %s refused the connection: %w", o.socket, err))
	}
	subCtx, subCancel := context.WithTimeout(ctx, clientCallTimeout)
	stream, err = protocol.SubscribeEvents(subCtx, o.socket, protocol.SubscribeEventsParams{UserDataName: clientProfile})
	subCancel()
	if err != nil {
		return wasInterrupted(fmt.Errorf("subscribing to the helper's events: %w", err))
	}
	defer stream.Close()
	stopStream := context.AfterFunc(ctx, func() { _ = stream.Close() })
	defer stopStream()

	bootCtx, bootCancel := context.WithTimeout(ctx, o.timeout)
	defer bootCancel()
	_, err = protocol.StartGuest(bootCtx, pipe, protocol.ConfigureParams{UserDataName: clientProfile}, protocol.StartVMParams{})
	if err != nil {
		return wasInterrupted(fmt.Errorf("starting the guest: %w", err))
	}
	if err := protocol.WaitGuestConnected(bootCtx, pipe, clientPollInterval); err != nil {
		if interrupted.Load() {
			return wasInterrupted(err)
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return 1, fmt.Errorf("the guest did not come up within %v (--timeout); the helper's log says why, and `cowork-vmm doctor` checks the host", o.timeout)
		}
		if errors.Is(err, protocol.ErrGuestStopped) {
			return 1, fmt.Errorf("%w; the helper's log says why, and `cowork-vmm doctor` checks the host", err)
		}
		return 1, err
	}
	if o.stopVM {
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), clientCallTimeout)
			defer cancel()
			if err := pipe.CallResult(stopCtx, protocol.MethodStopVM, nil, nil); err != nil {
				fmt.Fprintln(tio.stderr, "cowork-vmm client: stopping the guest:", err)
			}
		}()
	}
	procID, err := newClientProcessID()
	if err != nil {
		return 1, err
	}
	spawn := protocol.ClientSpawnParams{
		ID: procID, Name: o.session, Command: o.command[0], Args: o.command[1:],
		Cwd: o.workdir, Env: o.env, AdditionalMounts: o.mounts,
	}
	if spawn.Args == nil {
		spawn.Args = []string{} // the desktop client always sends the array
	}
	var spawned protocol.SpawnResult
	close(spawning)
	if err := call(protocol.MethodSpawn, spawn, &spawned); err != nil {
		if interrupted.Load() {
			return wasInterrupted(err)
		}
		return 127, err
	}
	for _, name := range spawned.FailedMounts {
		fmt.Fprintf(tio.stderr, "cowork-vmm client: --mount %s could not be made (the helper's log says why); the command runs without it\n", name)
	}

	spawnedID <- procID
	if tio.stdin != nil {
		go forwardClientStdin(ctx, pipe, procID, tio.stdin)
	}
	code, err := streamProcess(stream, procID, tio)
	if n := gaveUp.Load(); n != 0 {
		return int(n), errors.New("gave up waiting after a second signal: the command did not end and may still run in the guest (stopVM ends it)")
	}
	return code, err
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

// forwardClientStdin copies stdin to the process with writeStdin. The
// protocol has no end-of-input message, so the process never sees EOF. A
// UTF-8 sequence split by a read is held back until it is whole (writeStdin
// data is a JSON string).
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
		if send > 0 {
			callCtx, cancel := context.WithTimeout(ctx, clientCallTimeout)
			werr := pipe.CallResult(callCtx, protocol.MethodWriteStdin, protocol.WriteStdinParams{ID: id, Data: string(buf[:send])}, nil)
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
