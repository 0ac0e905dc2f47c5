package loader

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// cmdlineRoom is the space from x86.CmdlineAddr to the EBDA: no command
// line may be longer, whatever the kernel announces.
const cmdlineRoom = x86.EBDAStart - x86.CmdlineAddr

// ErrBadCmdline is returned for a command line the kernel cannot take.
var ErrBadCmdline = errors.New("bad kernel command line")

// WriteCmdline writes cmdline, NUL-terminated, at x86.CmdlineAddr. maxSize
// is the kernel's limit including the NUL (Kernel.CmdlineMaxSize); 0 means
// x86.CmdlineMaxSize. It returns the length written without the NUL.
func WriteCmdline(mem x86.GuestWriter, cmdline string, maxSize int) (int, error) {
	if maxSize <= 0 {
		maxSize = x86.CmdlineMaxSize
	}
	maxSize = int(min(uint64(maxSize), cmdlineRoom))
	if strings.IndexByte(cmdline, 0) >= 0 {
		return 0, fmt.Errorf("%w: it contains a NUL byte", ErrBadCmdline)
	}
	if len(cmdline)+1 > maxSize {
		return 0, fmt.Errorf("%w: kernel command line of %d bytes exceeds the kernel's limit of %d", ErrBadCmdline, len(cmdline), maxSize-1)
	}
	buf := make([]byte, len(cmdline)+1)
	copy(buf, cmdline)
	if err := mem.WriteAt(buf, x86.CmdlineAddr); err != nil {
		return 0, fmt.Errorf("write command line at %#x: %w", x86.CmdlineAddr, err)
	}
	return len(cmdline), nil
}
