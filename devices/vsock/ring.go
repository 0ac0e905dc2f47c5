package vsock

// byteRing is a FIFO of bytes with a hard capacity limit. Its storage grows
// by doubling as data arrives, up to limit, so idle connections cost little.
type byteRing struct {
	buf   []byte
	start int // index of the first byte
	n     int // bytes held
	limit int
}

func newByteRing(limit int) byteRing { return byteRing{limit: limit} }

func (r *byteRing) Len() int  { return r.n }
func (r *byteRing) Free() int { return r.limit - r.n }

// Write appends as much of p as fits under the limit and returns how much.
func (r *byteRing) Write(p []byte) int {
	if len(p) > r.Free() {
		p = p[:r.Free()]
	}
	if len(p) == 0 {
		return 0
	}
	r.grow(r.n + len(p))
	end := (r.start + r.n) % len(r.buf)
	c := copy(r.buf[end:], p)
	copy(r.buf, p[c:])
	r.n += len(p)
	return len(p)
}

// Read moves up to len(p) bytes into p.
func (r *byteRing) Read(p []byte) int {
	a, b := r.Peek(len(p))
	n := copy(p, a)
	n += copy(p[n:], b)
	r.Discard(n)
	return n
}

// Peek returns up to max held bytes as at most two slices, without
// consuming them; they stay valid until the next Write or Discard.
func (r *byteRing) Peek(max int) (first, second []byte) {
	if max > r.n {
		max = r.n
	}
	if max == 0 {
		return nil, nil
	}
	end := r.start + max
	if end <= len(r.buf) {
		return r.buf[r.start:end], nil
	}
	return r.buf[r.start:], r.buf[:end-len(r.buf)]
}

// Discard drops the first n held bytes (n <= Len()).
func (r *byteRing) Discard(n int) {
	r.n -= n
	if r.n == 0 {
		r.start = 0
		return
	}
	r.start = (r.start + n) % len(r.buf)
}

// Reset drops everything and releases the storage.
func (r *byteRing) Reset() { *r = byteRing{limit: r.limit} }

func (r *byteRing) grow(need int) {
	if need <= len(r.buf) {
		return
	}
	size := max(len(r.buf)*2, 4096)
	for size < need {
		size *= 2
	}
	size = min(size, r.limit)
	nb := make([]byte, size)
	a, b := r.Peek(r.n)
	copy(nb[copy(nb, a):], b)
	r.buf, r.start = nb, 0
}
