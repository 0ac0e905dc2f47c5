package agent

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/platformreg"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

// snapshotPointTimeout bounds the wait at the snapshot point: the VMM
// writes guest RAM to a file meanwhile (seconds on a slow disk).
const snapshotPointTimeout = 2 * time.Minute

// atSnapshotPoint tells the VMM that the agent has started and dialed
// nothing yet (platformreg.SnapshotPoint), waits while the VMM snapshots
// the VM, and says whether this VM was restored from such a snapshot.
// Without the device (another VMM) it goes on at once, as cold-booted.
func atSnapshotPoint(log *slog.Logger) (restored bool) {
	b, err := waitAtPoint()
	switch {
	case err != nil:
		log.Debug("agent: no snapshot point", "err", err)
	case b == guesthost.SnapshotPointWait:
		log.Warn("agent: the VMM held the snapshot point too long; going on")
	}
	return b == guesthost.SnapshotPointRestored
}

// waitAtPoint arrives at the snapshot point and waits while the VMM
// holds it there (at most snapshotPointTimeout); it returns the VMM's
// last answer.
func waitAtPoint() (uint8, error) {
	return pollRegister(platformreg.SnapshotPoint, guesthost.SnapshotPointArrive, time.Millisecond, snapshotPointTimeout,
		func(b uint8) bool { return b != guesthost.SnapshotPointWait })
}

// pollRegister writes value to the VMM's platform register reg, then
// reads it every interval until done says stop or timeout passes, and
// returns the last byte read.
func pollRegister(reg platformreg.Register, value uint8, interval, timeout time.Duration, done func(uint8) bool) (uint8, error) {
	r, err := platformreg.Open(reg)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	if err := r.WriteByte(value); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(timeout)
	for {
		b, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		if done(b) || time.Now().After(deadline) {
			return b, nil
		}
		time.Sleep(interval)
	}
}

// afterRestore makes a guest restored from a snapshot its own: every
// restore of one snapshot starts with the same random state, so the
// kernel's generator is reseeded from the VMM's entropy device before
// anything secret is made. (The wall clock is stepped at setup, from the
// helper's; the kernel's boot id is made on first read, after this.)
func afterRestore(log *slog.Logger) {
	if err := reseedFrom("/dev/hwrng", 64); err != nil {
		log.Warn("agent: restored from a snapshot, but the random generator could not be reseeded from the VMM", "err", err)
		return
	}
	log.Info("agent: restored from a snapshot; random generator reseeded")
}

// reseedFrom credits n bytes read from src to the kernel's entropy pool
// and has it reseed its generator at once (reseedWith).
func reseedFrom(src string, n int) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	seed := make([]byte, n)
	if _, err := io.ReadFull(f, seed); err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	return reseedWith(seed)
}

// reseedWith credits seed to the kernel's entropy pool and has it reseed
// its generator at once (RNDADDENTROPY, RNDRESEEDCRNG).
func reseedWith(seed []byte) error {
	n := len(seed)
	// struct rand_pool_info: entropy_count (bits), buf_size (bytes), buf.
	info := make([]byte, 8+n)
	copy(info[8:], seed)
	binary.NativeEndian.PutUint32(info[0:], uint32(8*n))
	binary.NativeEndian.PutUint32(info[4:], uint32(n))
	urandom, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer urandom.Close()
	fd := urandom.Fd()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); errno != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", errno)
	}
	return nil
}
