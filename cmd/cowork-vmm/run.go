package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/machine"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// bootKernel is `run --kernel K [--initrd I] [--cmdline C]`: K boots on our
// VMM with its serial console on the terminal until it resets or powers off
// (0), fails (1), or Ctrl-C stops it (130).
func bootKernel(o runOptions, log *slog.Logger, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exit, err := machine.RunKernel(ctx, machine.Config{
		Kernel: o.kernel, Initrd: o.initrd, Cmdline: o.cmdline,
		MemMiB: o.memMiB, CPUs: o.cpus, Console: os.Stdout, Logger: log,
	})
	if err != nil {
		fmt.Fprintln(stderr, "cowork-vmm run:", err)
		return 1
	}
	if ctx.Err() != nil {
		return 130
	}
	fmt.Fprintf(stderr, "cowork-vmm: the guest ended: %s\n", exit.Kind)
	return 0
}

// bootTimeout bounds how long run waits for the guest agent.
const bootTimeout = 2 * time.Minute

// runOptions are the run subcommand's flags.
type runOptions struct {
	mounts  []runMount
	env     map[string]string
	workdir string
	memMiB  int
	cpus    int
	debug   bool
	command []string
	// bundle is the client's VM bundle directory (--bundle), absolute; ""
	// for none.
	bundle string

	// VM flags. kernel alone picks the guest kernel of the kvm backend;
	// with initrd or cmdline, or without a command, run boots that kernel
	// directly on the VMM with its serial console on the terminal.
	kernel, initrd, cmdline string
}

// rawBoot says whether run boots a kernel directly rather than a guest agent.
func (o runOptions) rawBoot() bool {
	return o.kernel != "" && (o.initrd != "" || o.cmdline != "" || len(o.command) == 0)
}

type runMount struct {
	host, guest string
	readOnly    bool
}

// parseMount parses HOST:GUEST[:ro].
func parseMount(s string) (runMount, error) {
	parts := strings.Split(s, ":")
	var m runMount
	switch {
	case len(parts) == 2:
	case len(parts) == 3 && parts[2] == "ro":
		m.readOnly = true
	case len(parts) == 3 && parts[2] == "rw":
	default:
		return m, fmt.Errorf("--mount %q: want HOST:GUEST or HOST:GUEST:ro", s)
	}
	m.host, m.guest = parts[0], parts[1]
	if m.host == "" || !strings.HasPrefix(m.guest, "/") {
		return m, fmt.Errorf("--mount %q: HOST must be set and GUEST absolute", s)
	}
	return m, nil
}

type listFlag struct{ add func(string) error }

func (l listFlag) String() string     { return "" }
func (l listFlag) Set(s string) error { return l.add(s) }

// envFlag is a repeatable --env KEY=VALUE flag filling env.
func envFlag(env map[string]string) flag.Value {
	return listFlag{func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("--env %q: want KEY=VALUE", s)
		}
		env[k] = v
		return nil
	}}
}

func parseRunArgs(args []string, stderr io.Writer) (runOptions, error) {
	o := runOptions{env: map[string]string{}}
	fs := flagSet("cowork-vmm run", stderr)
	fs.Var(listFlag{func(s string) error {
		m, err := parseMount(s)
		o.mounts = append(o.mounts, m)
		return err
	}}, "mount", "share HOST:GUEST[:ro] (repeatable)")
	fs.Var(envFlag(o.env), "env", "set KEY=VALUE in the guest (repeatable)")
	fs.StringVar(&o.workdir, "workdir", "", "guest working directory")
	fs.IntVar(&o.memMiB, "mem", 0, "guest memory in MiB")
	fs.IntVar(&o.cpus, "cpus", 0, "guest vCPUs")
	fs.BoolVar(&o.debug, "debug", false, "log debug messages")
	fs.StringVar(&o.bundle, "bundle", "", "the client's VM bundle `dir`: boot its rootfs.img as the guest's userland (kvm backend)")
	fs.StringVar(&o.kernel, "kernel", "", "guest kernel (vmlinux or bzImage)")
	fs.StringVar(&o.initrd, "initrd", "", "initrd to boot the --kernel with (direct boot)")
	fs.StringVar(&o.cmdline, "cmdline", "", "extra kernel command line (direct boot)")
	fs.Usage = func() { usage(stderr) }
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.command = fs.Args()
	if o.bundle != "" {
		abs, err := filepath.Abs(o.bundle)
		if err != nil {
			return o, fmt.Errorf("run: --bundle: %w", err)
		}
		o.bundle = abs
	}
	if (o.initrd != "" || o.cmdline != "") && o.kernel == "" {
		return o, errors.New("run: --initrd and --cmdline need --kernel")
	}
	if o.rawBoot() && len(o.command) > 0 {
		return o, errors.New("run: a direct boot (--kernel with --initrd or --cmdline) runs no command; drop the command, or drop --initrd/--cmdline to run it through the guest agent")
	}
	if len(o.command) == 0 && !o.rawBoot() {
		return o, errors.New("run: no command given (cowork-vmm run [flags] -- CMD [ARG…])")
	}
	return o, nil
}

// runMain is `cowork-vmm run`: one command in a fresh guest, its output on
// the terminal, its exit status ours (128+n for a signal).
func runMain(args []string, stderr io.Writer) int {
	return runWith(args, stderr, backendFactories)
}

// runWith is runMain with the backends to choose from (tests).
func runWith(args []string, stderr io.Writer, backends func(*slog.Logger, io.Writer) map[string]helper.BackendFactory) int {
	o, err := parseRunArgs(args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	log, level := newLogger(stderr, o.debug)
	if !o.debug {
		// The command's output is the point; run reports failures itself.
		level.Set(slog.LevelError + 4)
	}
	if o.rawBoot() {
		return bootKernel(o, log, stderr)
	}
	if o.kernel != "" {
		// The kvm backend's documented override; only this process reads it.
		os.Setenv(kernel.Env, o.kernel)
	}
	agentLog := io.Discard // the command's output is the point
	if o.debug {
		agentLog = stderr
	}
	factories := backends(log, agentLog)
	backend, fallback := chooseRunBackend(factories, stderr)
	for {
		// Stateless: a run shares the helper's data directory but none of
		// its state (no profile of the client's is read, changed or taken).
		h, err := helper.New(helper.Options{Backend: backend, Backends: factories, FallbackHint: fallbackHint(backend, factories),
			Logger: log, LogLevel: level,
			Stateless:          true,
			EgressTestHosts:    os.Getenv(helper.EgressTestHostsEnv),
			EgressAllowPrivate: os.Getenv(egress.AllowPrivateEnv) == "1", EgressProxy: egress.UpstreamProxyFromEnv(os.Getenv)})
		if err != nil {
			fmt.Fprintln(stderr, "cowork-vmm run:", err)
			return 1
		}
		svc, err := h.Profile(runProfile, "")
		if err != nil {
			fmt.Fprintln(stderr, "cowork-vmm run:", err)
			return 1
		}
		code, err := runInGuest(context.Background(), svc, o, os.Stdin, os.Stdout, os.Stderr)
		var bootErr *startError
		if errors.As(err, &bootErr) && fallback {
			// The kvm backend was only preferred: fall back, once.
			reason := strings.TrimSuffix(bootErr.Error(), processFallbackHint)
			fmt.Fprintf(stderr, "cowork-vmm: %s; using the process backend (namespaced host processes). Set COWORK_VMM_BACKEND to choose.\n", reason)
			backend, fallback = helper.BackendProcess, false
			continue
		}
		if err != nil {
			fmt.Fprintln(stderr, "cowork-vmm run:", err)
		}
		return code
	}
}

// runProfile is the profile (userDataName) a run's guest belongs to.
const runProfile = "cowork-vmm-run"

// startError is a startVM failure, which run may answer by falling back.
type startError struct{ err error }

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

// chooseRunBackend honours COWORK_VMM_BACKEND. Unset, it prefers kvm when
// that backend is built in (fallback then says a failed start may retry on
// the process backend) and otherwise uses the process backend with a note.
func chooseRunBackend(factories map[string]helper.BackendFactory, stderr io.Writer) (backend string, fallback bool) {
	if b := os.Getenv("COWORK_VMM_BACKEND"); b != "" {
		return b, false
	}
	if factories[helper.BackendKVM] != nil {
		return helper.BackendKVM, factories[helper.BackendProcess] != nil
	}
	fmt.Fprintln(stderr, "cowork-vmm: the kvm backend is not built yet; using the process backend (namespaced host processes). Set COWORK_VMM_BACKEND to choose.")
	return helper.BackendProcess, false
}

// call runs one method on the service with Go-valued params.
func call(ctx context.Context, svc *helper.Service, method string, params, result any) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	res, err := svc.Call(ctx, method, raw)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	if result != nil {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		return json.Unmarshal(b, result)
	}
	return nil
}

// runInGuest boots a guest through the service, runs o.command and returns
// its exit status. The session it used is deleted afterwards.
func runInGuest(ctx context.Context, svc *helper.Service, o runOptions, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	session := "run-" + hex.EncodeToString(tag[:])
	const procID = "run"

	configure := map[string]any{"userDataName": runProfile, "userDataRoot": ""}
	if o.memMiB > 0 {
		configure["memoryMB"] = o.memMiB
	}
	if o.cpus > 0 {
		configure["cpuCount"] = o.cpus
	}
	if err := call(ctx, svc, protocol.MethodConfigure, configure, nil); err != nil {
		return 1, err
	}
	sub := svc.Events()
	defer sub.Close()
	if err := call(ctx, svc, protocol.MethodStartVM, protocol.StartVMParams{BundlePath: o.bundle}, nil); err != nil {
		return 1, &startError{err}
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		_ = svc.Close(stopCtx)
		_ = call(stopCtx, svc, protocol.MethodDeleteSessionDirs, map[string]any{"names": []string{session}}, nil)
	}()
	if err := waitConnected(ctx, svc); err != nil {
		return 1, err
	}
	for _, m := range o.mounts {
		host, err := filepath.Abs(m.host)
		if err == nil {
			err = svc.AddGuestMount(host, m.guest, m.readOnly)
		}
		if err != nil {
			return 1, fmt.Errorf("--mount %s:%s: %w", m.host, m.guest, err)
		}
	}
	spawn := map[string]any{"id": procID, "name": session, "command": o.command[0], "args": o.command[1:], "env": o.env}
	if o.workdir != "" {
		spawn["cwd"] = o.workdir
	}
	if err := call(ctx, svc, protocol.MethodSpawn, spawn, nil); err != nil {
		return 127, err
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go forwardSignals(ctx, svc, procID, sigs)
	go forwardStdin(ctx, svc, procID, stdin)

	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return 1, err
		}
		switch {
		case ev.ID != procID && ev.Type != protocol.EventError:
		case ev.Type == protocol.EventStdout:
			_, _ = io.WriteString(stdout, ev.Data)
		case ev.Type == protocol.EventStderr:
			_, _ = io.WriteString(stderr, ev.Data)
		case ev.Type == protocol.EventError:
			fmt.Fprintln(stderr, "cowork-vmm:", ev.Message)
		case ev.Type == protocol.EventExit:
			if ev.Signal != "" {
				return 128 + signalNumber(ev.Signal), nil
			}
			if ev.ExitCode != nil {
				return *ev.ExitCode, nil
			}
			return 0, nil
		}
	}
}

// waitConnected polls isGuestConnected as the client does.
func waitConnected(ctx context.Context, svc *helper.Service) error {
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		var c struct{ Connected bool }
		if err := call(ctx, svc, protocol.MethodIsGuestConnected, nil, &c); err != nil {
			return err
		}
		if c.Connected {
			return nil
		}
		var r struct{ Running bool }
		if err := call(ctx, svc, protocol.MethodIsRunning, nil, &r); err != nil {
			return err
		}
		if !r.Running {
			return errors.New("the guest ended before its agent connected (run with --debug for details)")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the guest agent: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func forwardSignals(ctx context.Context, svc *helper.Service, id string, sigs <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-sigs:
			name := map[os.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGHUP: "SIGHUP"}[sig]
			_ = call(ctx, svc, protocol.MethodKill, map[string]any{"id": id, "signal": name}, nil)
		}
	}
}

// forwardStdin copies stdin to the process, and its end (writeStdin's eof
// extension): a command reading its input ends as it would on the host.
func forwardStdin(ctx context.Context, svc *helper.Service, id string, stdin io.Reader) {
	buf := make([]byte, 32*1024)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			if call(ctx, svc, protocol.MethodWriteStdin, map[string]any{"id": id, "data": string(buf[:n])}, nil) != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			_ = call(ctx, svc, protocol.MethodWriteStdin, map[string]any{"id": id, "data": "", "eof": true}, nil)
		}
		if err != nil {
			return
		}
	}
}

// signalNumber is the number of a reported signal name, for the 128+n
// exit status; one that is not a signal is reported as a kill (9).
func signalNumber(name string) int {
	if sig, err := protocol.ParseSignal(name); err == nil {
		return int(sig)
	}
	return 9
}
