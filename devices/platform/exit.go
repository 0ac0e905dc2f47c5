package platform

import "sync"

const (
	// ExitPort is the I/O port of the test exit device (the port qemu's
	// isa-debug-exit uses by default).
	ExitPort = 0x501
	// ExitPortCount is how many ports the exit device decodes.
	ExitPortCount = 1
)

// ExitDevice lets a test guest end the VM with a status: writing byte v at
// offset 0 calls onExit(v) once. Not part of the product's machine; tiny
// test guests use it because they have no reboot path. Safe for
// concurrent use.
type ExitDevice struct {
	once   sync.Once
	onExit func(code uint8)
}

// NewExitDevice returns an exit port calling onExit (which must not block).
func NewExitDevice(onExit func(code uint8)) *ExitDevice {
	return &ExitDevice{onExit: onExit}
}

// Read implements the bus device read: zero.
func (e *ExitDevice) Read(offset uint64, data []byte) { clear(data) }

// Write implements the bus device write.
func (e *ExitDevice) Write(offset uint64, data []byte) {
	if offset != 0 || len(data) == 0 {
		return
	}
	e.once.Do(func() {
		if e.onExit != nil {
			e.onExit(data[0])
		}
	})
}
