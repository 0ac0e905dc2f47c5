package main

import (
	"context"
	"errors"
	"io"
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
	log, level := newLogger(stderr, *debug)

	var srv *protocol.Server
	svc, err := helper.New(helper.Options{
		Backend:  os.Getenv("COWORK_VMM_BACKEND"),
		Backends: backendFactories(log, stderr), // the agent logs beside the helper
		Logger:   log,
		// Test-only (see helper.EgressTestHostsEnv); logged loudly when set.
		EgressTestHosts:    os.Getenv(helper.EgressTestHostsEnv),
		EgressAllowPrivate: os.Getenv(egress.AllowPrivateEnv) == "1",
		EgressProxy:        egress.UpstreamProxyFromEnv(os.Getenv),
		LogLevel:           level,
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
	case err := <-serveErr:
		log.Error("serving the socket failed", "err", err)
		status = 1
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := svc.Close(stopCtx); err != nil {
		log.Error("stopping the guest", "err", err)
	}
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
