// Package serial emulates the 8250/16550A UART that Linux uses as its
// console (console=ttyS0): the register file with the divisor latch, the
// transmit-holding-register-empty and receive-data interrupts, loopback
// for the driver's probe, and a bounded receive FIFO for host input. Guest
// output goes to an io.Writer, buffered and flushed at each newline, when
// the buffer fills, or shortly after the last byte.
package serial
