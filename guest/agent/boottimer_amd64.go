package agent

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// outb writes one byte to an I/O port (boottimer_amd64.s). The calling thread
// must hold the port's permission (ioperm), or the instruction faults.
//
//go:noescape
func outb(port uint16, value uint8)

// writePortByte writes value to port with the outb instruction after
// ioperm. ioperm is per thread, so the goroutine stays on one thread for
// both; the permission is dropped again afterwards.
func writePortByte(port uint16, value uint8) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Ioperm(int(port), 1, 1); err != nil {
		return fmt.Errorf("ioperm(%#x): %w", port, err)
	}
	outb(port, value)
	_ = unix.Ioperm(int(port), 1, 0)
	return nil
}
