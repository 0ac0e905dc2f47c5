package sdkturn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/fakeapi"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

// Turn is one of a boot's turns.
type Turn struct {
	// ID is its Result's workload.
	ID   string
	Mode Mode
	// Cold: the caches are dropped first (Boot.DropCaches) and the CLI
	// gets a fresh HOME; else it is a later run with the HOME of the
	// previous turn of its mode.
	Cold bool
}

// WorkOp is the name turn's work is marked and accounted under
// (fsbench.MarkLine's metric).
func WorkOp(turn Turn) string { return "sdk_" + turn.ID }

// Turns are a boot's turns, in order: each mode cold, then warm.
var Turns = []Turn{
	{ID: "print_cold", Mode: ModePrint, Cold: true},
	{ID: "print_warm", Mode: ModePrint},
	{ID: "stream_cold", Mode: ModeStream, Cold: true},
	{ID: "stream_warm", Mode: ModeStream},
}

// The figures of a turn's Result, in nanoseconds from the spawn.
const (
	KeyFirstByte = "first_byte_ns"
	KeyExit      = "exit_ns"
)

// Boot is what a boot's turns run with.
type Boot struct {
	// Binary is the CLI as it sees itself (inside Root).
	Binary string
	// Root, when set, is the root the CLI runs chrooted in.
	Root string
	// HomeDir is a writable directory, as the CLI sees it, for its HOMEs.
	HomeDir string
	APIURL  string
	// DropCaches, when set, runs before each cold turn.
	DropCaches func() error
	// Start, Timeout: as in Spec.
	Start   func(start func() error) error
	Timeout time.Duration
	// OnTurn, when set, is called as each turn begins and ends: the
	// bounds of its work, for a host that counts what each turn costs.
	OnTurn func(turn Turn, begin bool)
}

// Run runs Turns in order and reports each one's Result: its figures, or
// why it failed (a later turn still runs).
func (b Boot) Run(ctx context.Context, report func(fsbench.Result)) {
	for _, turn := range Turns {
		if ctx.Err() != nil {
			report(fsbench.Result{Workload: turn.ID, Err: ctx.Err().Error()})
			continue
		}
		if b.OnTurn != nil {
			b.OnTurn(turn, true)
		}
		r := b.turn(ctx, turn)
		if b.OnTurn != nil {
			b.OnTurn(turn, false)
		}
		report(r)
	}
}

func (b Boot) turn(ctx context.Context, turn Turn) fsbench.Result {
	home := filepath.Join(b.HomeDir, "home-"+string(turn.Mode))
	fail := func(err error) fsbench.Result { return fsbench.Result{Workload: turn.ID, Err: err.Error()} }
	if turn.Cold {
		if err := os.RemoveAll(filepath.Join(b.Root, home)); err != nil {
			return fail(err)
		}
		if b.DropCaches != nil {
			if err := b.DropCaches(); err != nil {
				return fail(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(b.Root, home), 0o700); err != nil {
		return fail(err)
	}
	t, err := Run(ctx, Spec{Binary: b.Binary, Mode: turn.Mode, Home: home, APIURL: b.APIURL, Chroot: b.Root, Timeout: b.Timeout, Start: b.Start})
	if err != nil {
		return fail(err)
	}
	return fsbench.Result{Workload: turn.ID, Values: map[string]int64{KeyFirstByte: t.FirstByte.Nanoseconds(), KeyExit: t.Exit.Nanoseconds()}}
}

// Serve serves a fake Messages API on this machine's 127.0.0.1 and
// returns its base URL and a function that stops it.
func Serve() (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("the fake API's listener on the loopback: %w", err)
	}
	srv := &http.Server{Handler: &fakeapi.Handler{}, ReadHeaderTimeout: 30 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "sdkturn: the fake API stopped:", err)
		}
	}()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close(); <-done }, nil
}
