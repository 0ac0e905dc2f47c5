package serial

import (
	"io"
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/devices"
)

// Where the first serial port lives on a PC.
const (
	COM1Port = 0x3f8 // I/O port base of ttyS0
	COM1IRQ  = 4     // its ISA interrupt line
	// PortCount is how many I/O ports the UART decodes.
	PortCount = 8
	// KernelCmdline is what the guest's command line needs for this UART
	// as its console; nr_uarts=1 stops Linux probing COM2–COM4, which do
	// not exist.
	KernelCmdline = "console=ttyS0 8250.nr_uarts=1"
)

// Register offsets from the base port (DLAB is bit 7 of LCR).
const (
	regData = 0 // RBR (read) / THR (write); DLL when DLAB
	regIER  = 1 // IER; DLM when DLAB
	regIIR  = 2 // IIR (read) / FCR (write)
	regLCR  = 3
	regMCR  = 4
	regLSR  = 5
	regMSR  = 6
	regSCR  = 7
)

const (
	ierReceivedData = 0x01
	ierTHREmpty     = 0x02
	ierMask         = 0x0f

	iirNoInterrupt  = 0x01
	iirTHREmpty     = 0x02
	iirReceivedData = 0x04
	iirFIFOEnabled  = 0xc0 // reported always: we behave as a 16550A

	lcrDLAB = 0x80

	mcrDTR  = 0x01
	mcrRTS  = 0x02
	mcrOUT1 = 0x04
	mcrOUT2 = 0x08
	mcrLoop = 0x10
	mcrMask = 0x1f

	lsrDataReady = 0x01
	lsrTHREmpty  = 0x20
	lsrIdle      = 0x40 // transmitter empty

	msrCTS = 0x10
	msrDSR = 0x20
	msrRI  = 0x40
	msrDCD = 0x80
)

const (
	// InputCapacity bounds the receive FIFO; Inject drops what exceeds it.
	InputCapacity = 4096
	// outputBufferSize is flushed when full.
	outputBufferSize = 1024
	// flushDelay is how long output without a newline may wait.
	flushDelay = 20 * time.Millisecond
)

// UART is an 8250-compatible serial port (a 16550A to the guest). Read and
// Write are the bus-device methods for its 8 ports; they are safe for
// concurrent use and never block on the output writer for longer than one
// Write to it.
type UART struct {
	irq devices.IRQ

	mu           sync.Mutex
	out          io.Writer
	outBuf       []byte
	flushTimer   *time.Timer
	outErr       error
	ier          uint8
	lcr          uint8
	mcr          uint8
	scr          uint8
	dll, dlm     uint8
	thrPending   bool // THR-empty interrupt pending (cleared by reading IIR)
	input        []byte
	writeBytes   uint64
	droppedInput uint64
}

// New returns a UART that writes guest output to out and raises irq (nil:
// no interrupts). The divisor starts at 1 (115200 baud).
func New(out io.Writer, irq devices.IRQ) *UART {
	if out == nil {
		out = io.Discard
	}
	return &UART{out: out, irq: irq, dll: 1, mcr: mcrOUT2}
}

// Read implements the bus device read.
func (u *UART) Read(offset uint64, data []byte) {
	clear(data)
	if len(data) == 0 || offset >= PortCount {
		return
	}
	u.mu.Lock()
	data[0] = u.readRegister(offset)
	u.mu.Unlock()
}

func (u *UART) readRegister(offset uint64) uint8 {
	dlab := u.lcr&lcrDLAB != 0
	switch offset {
	case regData:
		if dlab {
			return u.dll
		}
		if len(u.input) == 0 {
			return 0
		}
		b := u.input[0]
		u.input = u.input[1:]
		if len(u.input) == 0 {
			u.input = nil // let the backing array go
		}
		return b
	case regIER:
		if dlab {
			return u.dlm
		}
		return u.ier
	case regIIR:
		iir := u.interruptIdentification()
		if iir == iirTHREmpty {
			u.thrPending = false // reading IIR acknowledges THRE
		}
		return iir | iirFIFOEnabled
	case regLCR:
		return u.lcr
	case regMCR:
		return u.mcr
	case regLSR:
		lsr := uint8(lsrTHREmpty | lsrIdle)
		if len(u.input) > 0 {
			lsr |= lsrDataReady
		}
		return lsr
	case regMSR:
		if u.mcr&mcrLoop != 0 {
			// Loopback: modem inputs mirror the modem outputs, which
			// Linux checks when probing the port.
			var msr uint8
			if u.mcr&mcrDTR != 0 {
				msr |= msrDSR
			}
			if u.mcr&mcrRTS != 0 {
				msr |= msrCTS
			}
			if u.mcr&mcrOUT1 != 0 {
				msr |= msrRI
			}
			if u.mcr&mcrOUT2 != 0 {
				msr |= msrDCD
			}
			return msr
		}
		return msrDCD | msrDSR | msrCTS
	case regSCR:
		return u.scr
	}
	return 0
}

// interruptIdentification is the highest-priority pending, enabled
// interrupt as IIR reports it (without the FIFO bits).
func (u *UART) interruptIdentification() uint8 {
	switch {
	case u.ier&ierReceivedData != 0 && len(u.input) > 0:
		return iirReceivedData
	case u.ier&ierTHREmpty != 0 && u.thrPending:
		return iirTHREmpty
	}
	return iirNoInterrupt
}

// Write implements the bus device write.
func (u *UART) Write(offset uint64, data []byte) {
	if len(data) == 0 || offset >= PortCount {
		return
	}
	u.mu.Lock()
	raise := u.writeRegister(offset, data[0])
	u.mu.Unlock()
	if raise && u.irq != nil {
		_ = u.irq.Trigger() // a lost edge only delays the guest's driver
	}
}

// writeRegister applies one register write and reports whether an
// interrupt edge should be raised.
func (u *UART) writeRegister(offset uint64, v uint8) bool {
	dlab := u.lcr&lcrDLAB != 0
	switch offset {
	case regData:
		if dlab {
			u.dll = v
			return false
		}
		if u.mcr&mcrLoop != 0 {
			u.pushInput([]byte{v})
		} else {
			u.emit(v)
		}
		// The byte leaves at once, so the holding register is empty again.
		u.thrPending = true
		return u.interruptIdentification() != iirNoInterrupt
	case regIER:
		if dlab {
			u.dlm = v
			return false
		}
		enabling := v&^u.ier&ierTHREmpty != 0
		u.ier = v & ierMask
		if enabling {
			// Enabling THRE interrupts with an empty THR interrupts at
			// once; Linux's 8250 driver starts transmitting this way.
			u.thrPending = true
		}
		return u.interruptIdentification() != iirNoInterrupt
	case regIIR:
		// FCR: FIFO control. The FIFOs are virtual; a receive-FIFO reset
		// (bit 1) drops pending input.
		if v&0x02 != 0 {
			u.input = nil
		}
	case regLCR:
		u.lcr = v
	case regMCR:
		u.mcr = v & mcrMask
	case regSCR:
		u.scr = v
	}
	return false
}

// Inject queues host input for the guest to read from RBR, raising the
// received-data interrupt when enabled. It returns how many bytes were
// queued; bytes beyond InputCapacity are dropped.
func (u *UART) Inject(p []byte) int {
	u.mu.Lock()
	n := u.pushInput(p)
	raise := n > 0 && u.interruptIdentification() == iirReceivedData
	u.mu.Unlock()
	if raise && u.irq != nil {
		_ = u.irq.Trigger()
	}
	return n
}

func (u *UART) pushInput(p []byte) int {
	n := min(len(p), InputCapacity-len(u.input))
	u.input = append(u.input, p[:n]...)
	u.droppedInput += uint64(len(p) - n)
	return n
}

// emit buffers one output byte and flushes at a newline or a full buffer;
// otherwise a timer flushes shortly.
func (u *UART) emit(b byte) {
	u.outBuf = append(u.outBuf, b)
	u.writeBytes++
	if b == '\n' || len(u.outBuf) >= outputBufferSize {
		u.flushLocked()
		return
	}
	if u.flushTimer == nil {
		u.flushTimer = time.AfterFunc(flushDelay, func() { _ = u.Flush() })
	}
}

// Flush writes buffered guest output now and returns the first error the
// writer ever returned (output continues to be attempted after an error).
func (u *UART) Flush() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.flushLocked()
	return u.outErr
}

func (u *UART) flushLocked() {
	if u.flushTimer != nil {
		u.flushTimer.Stop()
		u.flushTimer = nil
	}
	if len(u.outBuf) == 0 {
		return
	}
	if _, err := u.out.Write(u.outBuf); err != nil && u.outErr == nil {
		u.outErr = err
	}
	u.outBuf = u.outBuf[:0]
}

// Stats reports bytes the guest wrote and input bytes dropped because the
// receive FIFO was full.
func (u *UART) Stats() (written, droppedInput uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.writeBytes, u.droppedInput
}

// UARTState is what the guest's driver set in the UART (for a snapshot):
// its registers, a pending THR-empty interrupt and input not yet read.
type UARTState struct {
	IER, LCR, MCR, SCR, DLL, DLM uint8
	THRPending                   bool
	Input                        []byte
}

// SaveState flushes the guest's output and returns the UART's state.
func (u *UART) SaveState() UARTState {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.flushLocked()
	return UARTState{IER: u.ier, LCR: u.lcr, MCR: u.mcr, SCR: u.scr, DLL: u.dll, DLM: u.dlm,
		THRPending: u.thrPending, Input: append([]byte(nil), u.input...)}
}

// RestoreState sets the UART to s (SaveState's), input included up to
// the UART's input bound.
func (u *UART) RestoreState(s UARTState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ier, u.lcr, u.mcr, u.scr, u.dll, u.dlm = s.IER, s.LCR, s.MCR, s.SCR, s.DLL, s.DLM
	u.thrPending = s.THRPending
	u.input = u.input[:0]
	u.pushInput(s.Input)
}
