package fdlimit

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fill acquires one descriptor at a time from s until it is refused and
// returns how many it got.
func fill(s *Share) int {
	n := 0
	for s.Acquire(1) {
		n++
	}
	return n
}

// TestPoolSharedByDevices: the devices of every VM draw from one pool;
// the second device gets less than the first had alone, and the shares
// together never hold more than the pool's total, the limit less the
// reserve.
func TestPoolSharedByDevices(t *testing.T) {
	const limit = 8192
	p := NewPool(limit)
	require.Equal(t, limit-1024, p.Total())

	first := p.Share(0)
	alone := first.Limit()
	assert.Equal(t, p.Total(), alone, "one device alone may take the whole pool")
	second := p.Share(0)
	assert.Less(t, second.Limit(), alone, "a second device: each gets less")
	assert.Equal(t, p.Total()/2, second.Limit())

	got := fill(first) + fill(second)
	assert.Equal(t, p.Total(), got, "together they hold the total")
	assert.LessOrEqual(t, p.Used(), p.Total())

	third := p.Share(0)
	assert.Zero(t, fill(third), "a third device cannot go past the total while the others hold it")
	first.Release(first.Held())
	assert.Equal(t, p.Total()/3, fill(third), "once released, the third gets its part")
	assert.LessOrEqual(t, p.Used(), p.Total())
}

// TestShareOwnBound: a share never holds more than its own bound, and a
// closed share's part goes back to the others.
func TestShareOwnBound(t *testing.T) {
	p := NewPool(1 << 20)
	a := p.Share(100)
	assert.Equal(t, 100, fill(a))
	a.Release(100)
	assert.Zero(t, a.Held())
	b := p.Share(0)
	assert.Equal(t, p.Total()/2, b.Limit())
	a.Close()
	assert.Equal(t, p.Total(), b.Limit())
	assert.False(t, a.Acquire(1), "a closed share acquires nothing")
	a.Release(5) // more than it holds: ignored
	assert.Zero(t, p.Used())
}

// TestPoolLowLimit: a low limit still leaves the devices something, and
// the reserve something.
func TestPoolLowLimit(t *testing.T) {
	p := NewPool(1024)
	assert.Equal(t, 768, p.Total())
	assert.Equal(t, 768, fill(p.Share(0)))
	p.SetLimit(4096)
	assert.Equal(t, 4096-1024, p.Total())
	assert.Positive(t, NewPool(0).Total(), "0 reads the process's limit")
}
