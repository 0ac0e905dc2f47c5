package platform

import (
	"testing"

	"github.com/stretchr/testify/require"
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
	require.EqualValues(t, SnapshotPointWait, readAnswer(p))
	p.Write(0, []byte{7}) // not the arrival
	require.False(t, isClosed(p.Arrived()))
	p.Write(0, []byte{SnapshotPointArrive})
	p.Write(0, []byte{SnapshotPointArrive}) // twice is once
	require.True(t, isClosed(p.Arrived()))
	require.EqualValues(t, SnapshotPointWait, readAnswer(p))
	p.Release()
	require.EqualValues(t, SnapshotPointGo, readAnswer(p))
}

func TestSnapshotPointAnswers(t *testing.T) {
	require.EqualValues(t, SnapshotPointGo, readAnswer(NewSnapshotPoint(false)))
	r := NewRestoredSnapshotPoint()
	require.EqualValues(t, SnapshotPointRestored, readAnswer(r))
	r.Release() // a restored guest stays restored
	require.EqualValues(t, SnapshotPointRestored, readAnswer(r))
	wide := make([]byte, 4)
	r.Read(0, wide)
	require.Equal(t, []byte{SnapshotPointRestored, 0, 0, 0}, wide)
	r.Read(1, wide)
	require.Equal(t, []byte{0, 0, 0, 0}, wide)
}
