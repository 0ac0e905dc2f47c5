package fsrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
	"github.com/cowork-vmm/cowork-vmm/vmm"
)

// Other modes of the test guest (the SDK turns, package sdkturn) boot it
// on the same systems, sharing Dir and Root the same way, with their own
// kernel command line words and console lines.

// ModeRun is one boot of the test guest in another mode.
type ModeRun struct {
	Console string
	// Window, Busy and Exits are as FSRun's, from testinit's ready line to
	// the mode's end line.
	Window, Busy time.Duration
	Exits        vmm.Stats
}

// Mounts are the mounts of Dir (data) and Root (root; Type "" without
// one) the guest makes on file-sharing system, for a mode's command line
// (the devices Boot adds serve them).
func (b *FSBench) Mounts(system string) (data, root fsbench.Mount) {
	b.withDefaults()
	c := b.config(system)
	return c.Data, c.Root
}

// Boot boots the test guest once on file-sharing system, with Dir and
// Root shared as Run shares them and words added to its kernel command
// line (a mode of testinit's, whose last line is end), and returns its
// console once the guest ended, bounded by RunTimeout. An error with a
// console means the guest ran but did not end cleanly.
func (b *FSBench) Boot(ctx context.Context, system, words, end string) (ModeRun, error) {
	b.withDefaults()
	if guestboot.IsBlk(system) {
		return ModeRun{}, fmt.Errorf("%s is a block-device system: it shares no directory", system)
	}
	if why := b.Unavailable(system); why != "" {
		return ModeRun{}, fmt.Errorf("%w: %s", errSystemUnavailable, why)
	}
	if words == "" || end == "" {
		return ModeRun{}, errors.New("fsrun: a mode needs its command line words and its end line")
	}
	ctx, cancel := context.WithTimeout(ctx, b.RunTimeout)
	defer cancel()
	window := &busyWindow{end: end}
	console, err := b.boot(ctx, system, words, window)
	res := ModeRun{Console: console, Exits: window.exits()}
	res.Window, res.Busy = window.result()
	if err != nil {
		return res, fmt.Errorf("%s: %w", system, err)
	}
	return res, nil
}
