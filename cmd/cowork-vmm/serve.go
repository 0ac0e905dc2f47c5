package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// stopTimeout bounds the clean shutdown on SIGTERM: the guest's processes
// get the helper's grace period, then the guest is stopped.
const stopTimeout = 20 * time.Second

// deliverTimeout bounds the wait for the last events to reach the
// subscribers before the connections close.
const deliverTimeout = 2 * time.Second

// helperMain is `cowork-vmm -socket PATH`, the mode the desktop client uses.
func helperMain(args []string, stderr io.Writer) int {
	fs := flagSet("cowork-vmm", stderr)
	socket := fs.String("socket", "", "Unix socket `path` to serve the desktop client on")
	debug := fs.Bool("debug", false, "log debug messages (also switched by the client's setDebugLogging)")
	fs.Usage = func() { usage(stderr) }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *socket == "" || fs.NArg() > 0 {
		usage(stderr)
		return 2
	}
	// The client reads our stderr through a pipe. Once it is gone, a log
	// line must not kill the helper (Go's default for SIGPIPE on fd 1 and
	// 2) in the middle of stopping the guest: writes fail and are dropped.
	signal.Ignore(syscall.SIGPIPE)
	log, level := newLogger(stderr, *debug)

	var srv *protocol.Server
	// The agent logs beside the helper, through a pipe the helper drains
	// whatever becomes of stderr (lossyWriter).
	factories := backendFactories(log, lossyWriter{stderr})
	svc, err := helper.New(helper.Options{
		Backend:      os.Getenv("COWORK_VMM_BACKEND"),
		Backends:     factories,
		FallbackHint: fallbackHint(os.Getenv("COWORK_VMM_BACKEND"), factories),
		Logger:       log,
		// Test-only (see helper.EgressTestHostsEnv); logged loudly when set.
		EgressTestHosts:    os.Getenv(helper.EgressTestHostsEnv),
		EgressAllowPrivate: os.Getenv(egress.AllowPrivateEnv) == "1",
		EgressProxy:        egress.UpstreamProxyFromEnv(os.Getenv),
		// Test-only (see helper.MemInfoEnv); logged when set.
		MemInfo:  os.Getenv(helper.MemInfoEnv),
		LogLevel: level,
		OnDebugLogging: func(on bool) {
			if srv != nil {
				srv.SetDebug(on)
			}
		},
	})
	if err != nil {
		log.Error("cannot start the helper", "err", err)
		return 1
	}
	ln, err := protocol.Listen(*socket, log)
	if err != nil {
		log.Error("cannot listen on the socket", "err", err)
		return 1
	}
	srv = protocol.NewServer(protocol.ServerConfig{Handler: svc, Logger: log})
	srv.SetDebug(*debug)
	log.Info("cowork-vmm helper serving", "socket", ln.Path(), "version", version, "backend", backendName(), "data", svc.DataDir())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	status := 0
	select {
	case <-ctx.Done():
		log.Info("signal received; shutting down")
	case <-clientGone(os.Stdin, log):
		log.Info("the desktop client that started the helper has exited; shutting down as on SIGTERM")
	case err := <-serveErr:
		log.Error("serving the socket failed", "err", err)
		status = 1
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := svc.Close(stopCtx); err != nil {
		log.Error("stopping the guest", "err", err)
	}
	// The exits of the processes just ended, to the subscribers still there.
	deliverCtx, cancelDeliver := context.WithTimeout(stopCtx, deliverTimeout)
	svc.WaitDelivered(deliverCtx)
	cancelDeliver()
	if err := srv.Shutdown(stopCtx); err != nil && !errors.Is(err, protocol.ErrServerClosed) {
		log.Warn("closing client connections", "err", err)
	}
	if err := ln.Close(); err != nil {
		log.Warn("removing the socket", "err", err)
	}
	log.Info("helper stopped")
	return status
}

func backendName() string {
	if b := os.Getenv("COWORK_VMM_BACKEND"); b != "" {
		return b
	}
	return helper.BackendKVM
}

// clientGone is closed when the process that started the helper — the
// desktop client — has exited, however it died: the helper then shuts
// down as on SIGTERM rather than keep a guest nobody will reach (a client
// that comes back starts a helper of its own). The client starts the helper
// with stdin a pipe (or socket) of its own; end-of-file there wakes the
// check, and the helper's parent having changed (an orphan is adopted by
// init or a subreaper) confirms it, so a client that merely closes our
// stdin is not taken for gone; the parent is also checked every
// parentPollInterval. A stdin that is not a pipe or socket (a terminal,
// /dev/null: a helper started by hand, by a test or by the bench) is not
// watched: never closed.
func clientGone(stdin *os.File, log *slog.Logger) <-chan struct{} {
	fi, err := stdin.Stat()
	if err != nil || fi.Mode()&(os.ModeNamedPipe|os.ModeSocket) == 0 {
		return nil
	}
	parent := os.Getppid()
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin) // the client sends nothing
		close(eof)
	}()
	gone := make(chan struct{})
	go func() {
		t := time.NewTicker(parentPollInterval)
		defer t.Stop()
		for {
			select {
			case <-eof:
				log.Debug("stdin closed; checking whether the client is still there", "parent", parent)
				eof = nil
			case <-t.C:
			}
			if os.Getppid() != parent {
				close(gone)
				return
			}
		}
	}()
	return gone
}

// parentPollInterval is how often clientGone checks the helper's parent.
const parentPollInterval = time.Second

// lossyWriter writes to w and reports success whatever happens, so that a
// copier feeding it never stops: the guest agent's log pipe stays drained
// after the client (our stderr's reader) is gone, and the agent never sees
// a broken pipe.
type lossyWriter struct{ w io.Writer }

func (l lossyWriter) Write(p []byte) (int, error) {
	_, _ = l.w.Write(p)
	return len(p), nil
}
