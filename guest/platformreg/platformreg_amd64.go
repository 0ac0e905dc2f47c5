package platformreg

import (
	"fmt"
	"os"
)

// Device is where the register is reached from userspace: /dev/port
// (CONFIG_DEVPORT), as the guest kernel has no ioperm for long-lived use.
func (Register) Device() string { return "/dev/port" }

// Open opens reg's I/O port through /dev/port.
func Open(reg Register) (IO, error) {
	f, err := os.OpenFile(reg.Device(), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return &portIO{f: f, port: reg.port}, nil
}

// portIO is a port reached through /dev/port, whose file offset is the port.
type portIO struct {
	f    *os.File
	port int64
}

func (p *portIO) ReadByte() (byte, error) {
	b := make([]byte, 1)
	if _, err := p.f.ReadAt(b, p.port); err != nil {
		return 0, fmt.Errorf("reading port %#x: %w", p.port, err)
	}
	return b[0], nil
}

func (p *portIO) WriteByte(v byte) error {
	if _, err := p.f.WriteAt([]byte{v}, p.port); err != nil {
		return fmt.Errorf("writing port %#x: %w", p.port, err)
	}
	return nil
}

func (p *portIO) Close() error { return p.f.Close() }
