package serial

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// countingIRQ counts interrupt edges.
type countingIRQ struct{ n atomic.Int32 }

func (c *countingIRQ) Trigger() error { c.n.Add(1); return nil }

// syncBuffer is a goroutine-safe bytes.Buffer (the flush timer writes from
// its own goroutine).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func in(u *UART, offset uint64) byte {
	b := []byte{0xee}
	u.Read(offset, b)
	return b[0]
}

func out(u *UART, offset uint64, v byte) { u.Write(offset, []byte{v}) }

func TestOutputFlushesAtNewline(t *testing.T) {
	var sink syncBuffer
	u := New(&sink, nil)
	for _, b := range []byte("hello") {
		out(u, regData, b)
	}
	require.Empty(t, sink.String(), "no newline yet: still buffered")
	out(u, regData, '\n')
	require.Equal(t, "hello\n", sink.String())
	out(u, regData, '$')
	require.NoError(t, u.Flush())
	require.Equal(t, "hello\n$", sink.String())
	written, _ := u.Stats()
	require.EqualValues(t, 7, written)
}

func TestOutputFlushesWhenBufferFull(t *testing.T) {
	var sink syncBuffer
	u := New(&sink, nil)
	for range outputBufferSize {
		out(u, regData, 'x')
	}
	require.Len(t, sink.String(), outputBufferSize)
}

func TestFlushReportsWriterError(t *testing.T) {
	u := New(failingWriter{}, nil)
	out(u, regData, '\n')
	require.Error(t, u.Flush())
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestLineStatusAlwaysReadyToSend(t *testing.T) {
	u := New(nil, nil)
	require.Equal(t, byte(lsrTHREmpty|lsrIdle), in(u, regLSR))
	u.Inject([]byte{'a'})
	require.Equal(t, byte(lsrTHREmpty|lsrIdle|lsrDataReady), in(u, regLSR))
}

func TestDivisorLatch(t *testing.T) {
	var sink syncBuffer
	u := New(&sink, nil)
	out(u, regLCR, lcrDLAB|0x03)
	out(u, regData, 0x0c) // DLL
	out(u, regIER, 0x00)  // DLM
	require.EqualValues(t, 0x0c, in(u, regData))
	require.EqualValues(t, 0x00, in(u, regIER))
	out(u, regLCR, 0x03)
	require.EqualValues(t, 0x03, in(u, regLCR))
	require.Zero(t, in(u, regIER), "IER untouched by DLM writes")
	require.NoError(t, u.Flush())
	require.Empty(t, sink.String(), "divisor writes are not output")
}

func TestScratchAndIERReadBack(t *testing.T) {
	u := New(nil, nil)
	out(u, regSCR, 0xa5)
	require.EqualValues(t, 0xa5, in(u, regSCR))
	out(u, regIER, 0xff)
	require.EqualValues(t, 0x0f, in(u, regIER))
}

func TestTHREInterrupt(t *testing.T) {
	irq := &countingIRQ{}
	u := New(nil, irq)
	require.Equal(t, byte(iirNoInterrupt|iirFIFOEnabled), in(u, regIIR))

	// Enabling THRE with an empty THR interrupts at once.
	out(u, regIER, ierTHREmpty)
	require.EqualValues(t, 1, irq.n.Load())
	require.Equal(t, byte(iirTHREmpty|iirFIFOEnabled), in(u, regIIR))
	// Reading IIR acknowledged it.
	require.Equal(t, byte(iirNoInterrupt|iirFIFOEnabled), in(u, regIIR))

	// Each transmitted byte empties THR again: one more interrupt.
	out(u, regData, 'a')
	require.EqualValues(t, 2, irq.n.Load())
	require.Equal(t, byte(iirTHREmpty|iirFIFOEnabled), in(u, regIIR))

	// With THRE disabled, writes raise nothing.
	out(u, regIER, 0)
	out(u, regData, 'b')
	require.EqualValues(t, 2, irq.n.Load())
	require.Equal(t, byte(iirNoInterrupt|iirFIFOEnabled), in(u, regIIR))
}

func TestReceivedDataInterruptAndPriority(t *testing.T) {
	irq := &countingIRQ{}
	u := New(nil, irq)
	require.Equal(t, 2, u.Inject([]byte("hi")))
	require.Zero(t, irq.n.Load(), "receive interrupt not enabled")
	out(u, regIER, ierReceivedData|ierTHREmpty)
	require.EqualValues(t, 1, irq.n.Load())
	// Received data outranks THRE.
	require.Equal(t, byte(iirReceivedData|iirFIFOEnabled), in(u, regIIR))
	require.EqualValues(t, 'h', in(u, regData))
	require.EqualValues(t, 'i', in(u, regData))
	require.Zero(t, in(u, regLSR)&lsrDataReady)
	require.Equal(t, byte(iirTHREmpty|iirFIFOEnabled), in(u, regIIR))
	require.Zero(t, in(u, regData), "empty RBR reads 0")

	u.Inject([]byte("x"))
	require.EqualValues(t, 2, irq.n.Load())
}

func TestInputBounded(t *testing.T) {
	u := New(nil, nil)
	n := u.Inject(make([]byte, InputCapacity+10))
	require.Equal(t, InputCapacity, n)
	_, dropped := u.Stats()
	require.EqualValues(t, 10, dropped)
	out(u, regIIR, 0x02) // FCR: reset the receive FIFO
	require.Zero(t, in(u, regLSR)&lsrDataReady)
}

// Linux's 8250 probe puts the port in loopback with RTS|OUT2 and expects
// CTS|DCD back in MSR, then checks that transmitted bytes come back.
func TestLoopbackAsLinuxProbes(t *testing.T) {
	var sink syncBuffer
	u := New(&sink, nil)
	out(u, regMCR, mcrLoop|mcrRTS|mcrOUT2)
	require.EqualValues(t, 0x90, in(u, regMSR)&0xf0)
	out(u, regMCR, mcrLoop|mcrDTR|mcrOUT1)
	require.EqualValues(t, msrDSR|msrRI, in(u, regMSR)&0xf0)
	out(u, regData, 'z')
	require.NotZero(t, in(u, regLSR)&lsrDataReady)
	require.EqualValues(t, 'z', in(u, regData))
	out(u, regMCR, mcrDTR|mcrRTS|mcrOUT2)
	require.EqualValues(t, msrDCD|msrDSR|msrCTS, in(u, regMSR))
	require.NoError(t, u.Flush())
	require.Empty(t, sink.String(), "loopback bytes are not output")
}

func TestOddAccessesAreHarmless(t *testing.T) {
	u := New(nil, nil)
	u.Read(8, make([]byte, 1))
	u.Write(100, []byte{1})
	u.Read(0, nil)
	u.Write(0, nil)
	wide := []byte{0xff, 0xff, 0xff, 0xff}
	u.Read(regLSR, wide)
	require.Equal(t, []byte{lsrTHREmpty | lsrIdle, 0, 0, 0}, wide)
}

func TestConcurrentAccess(t *testing.T) {
	var sink syncBuffer
	u := New(&sink, &countingIRQ{})
	out(u, regIER, ierTHREmpty|ierReceivedData)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				out(u, regData, 'a')
				in(u, regIIR)
				in(u, regLSR)
				u.Inject([]byte{'b'})
				in(u, regData)
			}
		})
	}
	wg.Wait()
	require.NoError(t, u.Flush())
	require.Len(t, sink.String(), 800)
}

// A UART restored from another's state reads back the registers the
// guest's driver set there, and the input not yet read.
func TestStateRestoresIntoAFreshUART(t *testing.T) {
	u := New(nil, nil)
	out(u, regLCR, lcrDLAB|0x03)
	out(u, 0, 0x0c) // DLL: 9600 baud
	out(u, regLCR, 0x03)
	out(u, regIER, 0x05)
	out(u, regMCR, 0x0b)
	out(u, regSCR, 0x5a)
	u.Inject([]byte("ab"))
	s := u.SaveState()

	fresh := New(nil, nil)
	fresh.RestoreState(s)
	require.EqualValues(t, 0x03, in(fresh, regLCR))
	require.EqualValues(t, 0x05, in(fresh, regIER))
	require.EqualValues(t, 0x0b, in(fresh, regMCR))
	require.EqualValues(t, 0x5a, in(fresh, regSCR))
	require.EqualValues(t, 'a', in(fresh, 0))
	require.EqualValues(t, 'b', in(fresh, 0))
	out(fresh, regLCR, lcrDLAB|0x03)
	require.EqualValues(t, 0x0c, in(fresh, 0), "the divisor latch")
}
