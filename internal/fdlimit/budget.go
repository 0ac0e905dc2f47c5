package fdlimit

import (
	"sync"

	"golang.org/x/sys/unix"
)

// MinShare is the least a share's fair part is computed as, however many
// shares a Pool has: a device needs a few descriptors to serve anything.
// The Pool's total still bounds the sum (see Share.Acquire).
const MinShare = 64

// Pool is the helper-wide descriptor budget of the file-sharing devices:
// one per helper process, made by whoever starts VMs and handed to each
// device as a Share. The total is the process's RLIMIT_NOFILE less a
// reserve for everything else the helper opens (client sockets, state
// files, the VMs themselves), so however many VMs of however many
// profiles run, their devices together never take the descriptors the
// helper needs to keep serving. Parts are not taken back: a device that
// held more than its part when another started keeps what it holds (its
// guest's files are open) and gets no more until it is under, so a VM
// started while the others hold the whole total gets ENFILE until they
// release some. Safe for concurrent use.
type Pool struct {
	mu     sync.Mutex
	total  int // descriptors the shares may hold together
	used   int // descriptors the shares hold
	shares int // live shares, which divide total between them
}

// NewPool returns a pool under limit, the process's RLIMIT_NOFILE (0:
// read it now).
func NewPool(limit uint64) *Pool {
	p := &Pool{}
	p.SetLimit(limit)
	return p
}

// SetLimit sets the pool's total from limit, the process's RLIMIT_NOFILE
// (0: read it now), after Raise has lifted it, say. Descriptors already
// held stay held; new ones are refused until the holders are under the
// new total.
func (p *Pool) SetLimit(limit uint64) {
	if limit == 0 {
		limit = currentLimit()
	}
	total := int(min(limit-Reserve(limit), 1<<30))
	p.mu.Lock()
	p.total = total
	p.mu.Unlock()
}

// Reserve is what a Pool under limit leaves for everything else the
// helper opens: 1024 descriptors, or a quarter of a limit too low for that.
func Reserve(limit uint64) uint64 { return min(reserve, limit/4) }

// currentLimit is the process's soft RLIMIT_NOFILE (the kernel's default
// soft limit when it cannot be read).
func currentLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	return rl.Cur
}

// Share returns a new share of the pool for one device, which holds at
// most max descriptors (0: no bound of its own); Close gives it back.
func (p *Pool) Share(max int) *Share {
	p.mu.Lock()
	p.shares++
	p.mu.Unlock()
	return &Share{pool: p, max: max}
}

// Total is how many descriptors the shares may hold together.
func (p *Pool) Total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total
}

// Used is how many descriptors the shares hold together.
func (p *Pool) Used() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// Share is one device's part of a Pool. Every host descriptor the device
// holds for its guest is acquired from it before it is opened and
// released when it is closed. Safe for concurrent use.
type Share struct {
	pool *Pool
	max  int
	held int // guarded by pool.mu
	gone bool
}

// limitLocked is the most s may hold now: an equal part of the pool's
// total for each live share (at least MinShare), at most s.max. More
// shares each get less; a share holding more than its part keeps it but
// gets no more until it is under.
func (s *Share) limitLocked() int {
	n := max(s.pool.total/max(s.pool.shares, 1), MinShare)
	if s.max > 0 {
		n = min(n, s.max)
	}
	return n
}

// Limit is the most s may hold now (see Acquire).
func (s *Share) Limit() int {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.limitLocked()
}

// Held is how many descriptors s holds.
func (s *Share) Held() int {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.held
}

// Acquire takes n descriptors from s and says whether it could: not past
// s's part of the pool, and never past the pool's total (whatever the
// parts, the shares together hold at most Total). A closed share
// acquires nothing.
func (s *Share) Acquire(n int) bool {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.gone || n < 0 || s.held+n > s.limitLocked() || p.used+n > p.total {
		return false
	}
	s.held += n
	p.used += n
	return true
}

// Release gives back n descriptors acquired from s (closed since).
func (s *Share) Release(n int) {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	n = min(n, s.held)
	s.held -= n
	p.used -= n
}

// Close ends s: the pool's total is divided between the other shares
// from now on. What s still holds counts until it is released.
func (s *Share) Close() {
	p := s.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if !s.gone {
		s.gone = true
		p.shares--
	}
}
