package vsock

import (
	"bytes"
	"testing"
	"time"
)

func TestByteRingWrapsAndCaps(t *testing.T) {
	r := newByteRing(10000)
	var want bytes.Buffer
	next := byte(0)
	chunk := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = next
			next++
		}
		return b
	}
	out := make([]byte, 3000)
	for i := range 50 {
		p := chunk(1000 + i*37)
		n := r.Write(p)
		if free := 10000 - want.Len(); n != min(len(p), free) {
			t.Fatalf("Write took %d of %d with %d free", n, len(p), free)
		}
		want.Write(p[:n])
		next -= byte(len(p) - n) // bytes not taken are offered again next time
		got := out[:r.Read(out[:700+i*13])]
		if exp := want.Next(len(got)); !bytes.Equal(got, exp) {
			t.Fatalf("round %d: read %d bytes that differ from what was written", i, len(got))
		}
		if r.Len() != want.Len() || r.Len() > 10000 {
			t.Fatalf("Len %d, want %d", r.Len(), want.Len())
		}
	}
	if len(r.buf) > 10000 {
		t.Fatalf("storage grew to %d, beyond the limit", len(r.buf))
	}
}

func TestDeadlineMoves(t *testing.T) {
	d := newDeadline()
	if isClosed(d.expired()) {
		t.Fatal("a new deadline is expired")
	}
	d.set(time.Now().Add(-time.Second))
	if !isClosed(d.expired()) {
		t.Fatal("a past deadline is not expired")
	}
	d.set(time.Time{})
	if isClosed(d.expired()) {
		t.Fatal("clearing the deadline left it expired")
	}
	d.set(time.Now().Add(time.Millisecond))
	select {
	case <-d.expired():
	case <-time.After(10 * time.Second):
		t.Fatal("deadline never expired")
	}
}
