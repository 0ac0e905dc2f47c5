package platform

import "sync"

const (
	// I8042Port is the first I/O port of the i8042 window: data at
	// offset 0 (port 0x60), status/command at offset 4 (port 0x64).
	I8042Port = 0x60
	// I8042PortCount is the window's size (ports 0x60–0x64), as in
	// Firecracker; offsets 1–3 read as zero.
	I8042PortCount = 5

	i8042Data    = 0
	i8042Command = 4
)

// KernelCmdline is what to add to the guest's command line for these
// devices: reboot through the keyboard controller (so "reboot" ends the VM
// via onReset), and no probing of a mouse port, multiplexer or keyboard
// LEDs that would only cost boot time (as Firecracker does).
const KernelCmdline = "reboot=k i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd"

// i8042 commands we answer (what Linux's i8042 driver sends when probing)
// and their replies.
const (
	cmdReadCTR       = 0x20
	cmdWriteCTR      = 0x60
	cmdDisableAux    = 0xa7
	cmdEnableAux     = 0xa8
	cmdTestAux       = 0xa9
	cmdSelfTest      = 0xaa
	cmdTestKbd       = 0xab
	cmdDisableKbd    = 0xad
	cmdEnableKbd     = 0xae
	cmdReadOutPort   = 0xd0
	cmdWriteOutPort  = 0xd1
	cmdWriteKbdOut   = 0xd2 // echo the next data byte as if from the keyboard
	cmdWriteAuxOut   = 0xd3 // echo the next data byte as if from the mouse
	cmdResetCPU      = 0xfe
	selfTestPassed   = 0x55
	statusOutputFull = 0x01
	statusSystemFlag = 0x04
	statusCmdData    = 0x08 // last write was a command
)

// I8042 is the keyboard controller, reduced to what a VM without a
// keyboard needs: Linux's probe gets consistent answers quickly (no
// timeouts that slow boot), and command 0xFE (pulse the reset line) calls
// onReset, which the VMM uses to end the VM — Linux's reboot path. Safe
// for concurrent use.
type I8042 struct {
	onReset func()

	mu         sync.Mutex
	ctr        uint8 // controller configuration byte
	outPort    uint8
	pendingCmd uint8 // command awaiting its data byte (0x60, 0xd1)
	output     []byte
	status     uint8
}

// NewI8042 returns a controller that calls onReset (which must not
// block) each time the guest asks for a CPU reset.
func NewI8042(onReset func()) *I8042 {
	return &I8042{onReset: onReset, ctr: 0x30, outPort: 0x01}
}

// Read implements the bus device read.
func (c *I8042) Read(offset uint64, data []byte) {
	clear(data)
	if len(data) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch offset {
	case i8042Data:
		if len(c.output) > 0 {
			data[0] = c.output[0]
			c.output = c.output[1:]
		}
	case i8042Command:
		data[0] = c.status
		if len(c.output) > 0 {
			data[0] |= statusOutputFull
		}
	}
}

// Write implements the bus device write.
func (c *I8042) Write(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	v := data[0]
	c.mu.Lock()
	reset := false
	switch offset {
	case i8042Command:
		c.status |= statusCmdData
		reset = c.command(v)
	case i8042Data:
		c.status &^= statusCmdData
		switch c.pendingCmd {
		case cmdWriteCTR:
			c.ctr = v
			if v&statusSystemFlag != 0 {
				c.status |= statusSystemFlag
			}
		case cmdWriteOutPort:
			c.outPort = v
			reset = v&0x01 == 0 // bit 0 low holds the CPU in reset
		case cmdWriteKbdOut, cmdWriteAuxOut:
			c.reply(v)
		}
		c.pendingCmd = 0
	}
	c.mu.Unlock()
	if reset && c.onReset != nil {
		c.onReset()
	}
}

// command handles one controller command and reports whether it resets
// the CPU.
func (c *I8042) command(cmd uint8) bool {
	c.pendingCmd = 0
	switch cmd {
	case cmdReadCTR:
		c.reply(c.ctr)
	case cmdWriteCTR, cmdWriteOutPort, cmdWriteKbdOut, cmdWriteAuxOut:
		c.pendingCmd = cmd
	case cmdReadOutPort:
		c.reply(c.outPort)
	case cmdSelfTest:
		c.reply(selfTestPassed)
	case cmdTestKbd, cmdTestAux:
		c.reply(0x00) // interface test passed
	case cmdDisableKbd, cmdEnableKbd, cmdDisableAux, cmdEnableAux:
	case cmdResetCPU:
		return true
	}
	return false
}

// reply queues one byte for the data port; the queue stays tiny because
// each command replies with at most one byte and a hostile guest that
// never reads just overwrites the oldest.
func (c *I8042) reply(b uint8) {
	if len(c.output) >= 16 {
		c.output = c.output[1:]
	}
	c.output = append(c.output, b)
}
