package platform

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

func TestBootTimerRecordsOnce(t *testing.T) {
	var calls atomic.Int32
	start := time.Now().Add(-time.Second)
	bt := NewBootTimer(start, func(time.Duration) { calls.Add(1) })

	_, ok := bt.Elapsed()
	require.False(t, ok)
	bt.Write(0, []byte{guesthost.BootTimerMagic - 1}) // wrong value
	bt.Write(1, []byte{guesthost.BootTimerMagic})     // wrong offset
	bt.Write(0, nil)                                  // empty access
	_, ok = bt.Elapsed()
	require.False(t, ok)
	select {
	case <-bt.Done():
		t.Fatal("Done closed before the magic value")
	default:
	}

	bt.Write(0, []byte{guesthost.BootTimerMagic})
	first, ok := bt.Elapsed()
	require.True(t, ok)
	require.GreaterOrEqual(t, first, time.Second)
	<-bt.Done()

	bt.Write(0, []byte{guesthost.BootTimerMagic, 0, 0, 0}) // a later write changes nothing
	again, ok := bt.Elapsed()
	require.True(t, ok)
	require.Equal(t, first, again)
	require.EqualValues(t, 1, calls.Load())

	data := []byte{0xff, 0xff}
	bt.Read(0, data)
	require.Equal(t, []byte{0, 0}, data)
}

func TestBootTimerConcurrentWrites(t *testing.T) {
	var calls atomic.Int32
	bt := NewBootTimer(time.Now(), func(time.Duration) { calls.Add(1) })
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { bt.Write(0, []byte{guesthost.BootTimerMagic}) })
	}
	wg.Wait()
	require.EqualValues(t, 1, calls.Load())
}

func readByte(c *I8042, offset uint64) byte {
	b := []byte{0xee}
	c.Read(offset, b)
	return b[0]
}

func TestI8042ResetCommand(t *testing.T) {
	var resets atomic.Int32
	c := NewI8042(func() { resets.Add(1) })
	require.Zero(t, readByte(c, i8042Command)&statusOutputFull)
	c.Write(i8042Command, []byte{cmdResetCPU})
	require.EqualValues(t, 1, resets.Load())
	c.Write(i8042Data, []byte{cmdResetCPU}) // 0xFE on the data port is not a reset
	require.EqualValues(t, 1, resets.Load())
}

func TestI8042ResetThroughOutputPort(t *testing.T) {
	var resets atomic.Int32
	c := NewI8042(func() { resets.Add(1) })
	c.Write(i8042Command, []byte{cmdWriteOutPort})
	c.Write(i8042Data, []byte{0x03}) // reset line high: no reset
	require.Zero(t, resets.Load())
	c.Write(i8042Command, []byte{cmdWriteOutPort})
	c.Write(i8042Data, []byte{0x02}) // bit 0 low: reset
	require.EqualValues(t, 1, resets.Load())
}

func TestI8042AnswersLinuxProbe(t *testing.T) {
	c := NewI8042(nil)
	// Self test answers 0x55 with the output buffer full.
	c.Write(i8042Command, []byte{cmdSelfTest})
	require.NotZero(t, readByte(c, i8042Command)&statusOutputFull)
	require.EqualValues(t, selfTestPassed, readByte(c, i8042Data))
	require.Zero(t, readByte(c, i8042Command)&statusOutputFull)

	// Write then read back the configuration byte.
	c.Write(i8042Command, []byte{cmdWriteCTR})
	c.Write(i8042Data, []byte{0x47})
	c.Write(i8042Command, []byte{cmdReadCTR})
	require.EqualValues(t, 0x47, readByte(c, i8042Data))

	// Aux loopback echoes.
	c.Write(i8042Command, []byte{cmdWriteAuxOut})
	c.Write(i8042Data, []byte{0x5a})
	require.EqualValues(t, 0x5a, readByte(c, i8042Data))

	// Unknown commands and ports 0x61–0x63 are harmless.
	c.Write(i8042Command, []byte{0x01})
	require.Zero(t, readByte(c, 1))
	require.Zero(t, readByte(c, 3))
	c.Read(0, nil)
	c.Write(0, nil)
}

func TestI8042OutputQueueBounded(t *testing.T) {
	c := NewI8042(nil)
	for range 1000 {
		c.Write(i8042Command, []byte{cmdSelfTest})
	}
	c.mu.Lock()
	n := len(c.output)
	c.mu.Unlock()
	require.LessOrEqual(t, n, 16)
}

func TestExitDevice(t *testing.T) {
	var codes []uint8
	e := NewExitDevice(func(code uint8) { codes = append(codes, code) })
	e.Write(1, []byte{9})
	e.Write(0, []byte{7})
	e.Write(0, []byte{8})
	require.Equal(t, []uint8{7}, codes)
}
