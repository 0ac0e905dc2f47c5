package platformreg

import "github.com/cowork-vmm/cowork-vmm/protocol/guesthost"

// Register is one of the VMM's one-byte platform registers: an I/O
// port on x86, a byte at the start of an MMIO page on arm64
// (protocol/guesthost).
type Register struct {
	port int64
	mmio int64
}

// The registers.
var (
	BootTimer     = Register{port: guesthost.BootTimerPort, mmio: guesthost.BootTimerMMIO}
	SnapshotPoint = Register{port: guesthost.SnapshotPointPort, mmio: guesthost.SnapshotPointMMIO}
)

// IO reads and writes an open platform register.
type IO interface {
	ReadByte() (byte, error)
	WriteByte(byte) error
	Close() error
}

// WriteOnce opens reg, writes v and closes it.
func WriteOnce(reg Register, v byte) error {
	r, err := Open(reg)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.WriteByte(v)
}
