package agent

import (
	"strings"
	"unicode/utf8"
)

// utf8Chunker turns a byte stream, delivered in arbitrary pieces, into UTF-8
// text chunks: a multi-byte character split across pieces is carried over to
// the next chunk instead of being broken, and every invalid byte becomes
// U+FFFD. Concatenating all chunks (and the final Flush) gives the same text
// as converting the whole stream at once.
type utf8Chunker struct {
	carry [utf8.UTFMax]byte
	n     int // bytes in carry, always < utf8.UTFMax
}

// Push converts p, prefixed by any carried bytes, and returns the text up to
// the last complete character; an incomplete trailing character is kept.
func (c *utf8Chunker) Push(p []byte) string {
	if c.n > 0 {
		buf := make([]byte, 0, c.n+len(p))
		buf = append(buf, c.carry[:c.n]...)
		buf = append(buf, p...)
		p = buf
		c.n = 0
	}
	cut := incompleteTail(p)
	c.n = copy(c.carry[:], p[cut:])
	return toValidUTF8(p[:cut])
}

// Flush returns the carried bytes at end of stream (an incomplete character
// there is invalid: each byte becomes U+FFFD).
func (c *utf8Chunker) Flush() string {
	s := toValidUTF8(c.carry[:c.n])
	c.n = 0
	return s
}

// incompleteTail returns the index where a trailing, valid-so-far but
// incomplete UTF-8 sequence starts, or len(p) if there is none.
func incompleteTail(p []byte) int {
	for i := len(p) - 1; i >= 0 && i >= len(p)-(utf8.UTFMax-1); i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				return i
			}
			return len(p)
		}
	}
	return len(p)
}

// toValidUTF8 converts p to a string, replacing every invalid byte (not every
// run) with U+FFFD, the way decoding rune by rune does.
func toValidUTF8(p []byte) string {
	if utf8.Valid(p) {
		return string(p)
	}
	var b strings.Builder
	b.Grow(len(p) + 8)
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.Write(p[:size])
		}
		p = p[size:]
	}
	return b.String()
}
