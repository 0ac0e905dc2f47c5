package platform

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

func readAnswer(p *SnapshotPoint) byte {
	b := []byte{0xee}
	p.Read(0, b)
	return b[0]
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestSnapshotPointHoldsUntilRelease(t *testing.T) {
	p := NewSnapshotPoint(true)
	require.EqualValues(t, guesthost.SnapshotPointWait, readAnswer(p))
	p.Write(0, []byte{7}) // not the arrival
	require.False(t, isClosed(p.Arrived()))
	p.Write(0, []byte{guesthost.SnapshotPointArrive})
	p.Write(0, []byte{guesthost.SnapshotPointArrive}) // twice is once
	require.True(t, isClosed(p.Arrived()))
	require.EqualValues(t, guesthost.SnapshotPointWait, readAnswer(p))
	p.Release()
	require.EqualValues(t, guesthost.SnapshotPointGo, readAnswer(p))
}

func TestSnapshotPointAnswers(t *testing.T) {
	require.EqualValues(t, guesthost.SnapshotPointGo, readAnswer(NewSnapshotPoint(false)))
	r := NewRestoredSnapshotPoint()
	require.EqualValues(t, guesthost.SnapshotPointRestored, readAnswer(r))
	r.Release() // a restored guest stays restored
	require.EqualValues(t, guesthost.SnapshotPointRestored, readAnswer(r))
	wide := make([]byte, 4)
	r.Read(0, wide)
	require.Equal(t, []byte{guesthost.SnapshotPointRestored, 0, 0, 0}, wide)
	r.Read(1, wide)
	require.Equal(t, []byte{0, 0, 0, 0}, wide)
}

// A guest that arrived at boot and went on is held again at its next
// arrival after Hold (a suspend), and only that arrival is reported.
func TestSnapshotPointHoldsASecondArrival(t *testing.T) {
	p := NewSnapshotPoint(false)
	p.Write(0, []byte{guesthost.SnapshotPointArrive})
	require.True(t, isClosed(p.Arrived()))
	p.Hold()
	require.False(t, isClosed(p.Arrived()), "the boot's arrival is not the suspend's")
	require.EqualValues(t, guesthost.SnapshotPointWait, readAnswer(p))
	p.Write(0, []byte{guesthost.SnapshotPointArrive})
	require.True(t, isClosed(p.Arrived()))
	require.EqualValues(t, guesthost.SnapshotPointWait, readAnswer(p), "held while the VM is saved")

	r := NewRestoredSnapshotPoint() // restored mid-wait: no arrival of its own
	r.Hold()
	require.False(t, isClosed(r.Arrived()))
	r.Write(0, []byte{guesthost.SnapshotPointArrive})
	require.True(t, isClosed(r.Arrived()))
}
