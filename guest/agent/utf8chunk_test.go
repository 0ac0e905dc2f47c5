package agent

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// referenceText is an independent conversion: ranging over a string yields
// U+FFFD for every invalid byte.
func referenceText(p []byte) string {
	var b strings.Builder
	for _, r := range string(p) {
		b.WriteRune(r)
	}
	return b.String()
}

// chunkAt feeds data to a chunker in pieces ending at the given cut points.
func chunkAt(data []byte, cuts []int) []string {
	var c utf8Chunker
	var out []string
	prev := 0
	for _, cut := range cuts {
		if cut < prev || cut > len(data) {
			continue
		}
		out = append(out, c.Push(data[prev:cut]))
		prev = cut
	}
	out = append(out, c.Push(data[prev:]), c.Flush())
	return out
}

func TestUTF8ChunkerKeepsCharactersWhole(t *testing.T) {
	euro := []byte("a€b😀c") // 3- and 4-byte characters
	for cut := 0; cut <= len(euro); cut++ {
		for cut2 := cut; cut2 <= len(euro); cut2++ {
			chunks := chunkAt(euro, []int{cut, cut2})
			for _, ch := range chunks {
				require.True(t, utf8.ValidString(ch))
				require.NotContains(t, ch, "\uFFFD", "cuts %d,%d", cut, cut2)
			}
			require.Equal(t, "a€b😀c", strings.Join(chunks, ""))
		}
	}
}

func TestUTF8ChunkerReplacesInvalidBytes(t *testing.T) {
	cases := map[string]struct {
		in   []byte
		want string
	}{
		"lone continuation":       {[]byte("a\x80b"), "a\uFFFDb"},
		"0xff":                    {[]byte("a\xffb"), "a\uFFFDb"},
		"truncated at the end":    {[]byte("a\xe2\x82"), "a\uFFFD\uFFFD"},
		"bad second byte":         {[]byte("\xe0\x80x"), "\uFFFD\uFFFDx"},
		"surrogate":               {[]byte("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD"},
		"real replacement char":   {[]byte("\uFFFD"), "\uFFFD"},
		"leader then ascii":       {[]byte("\xf0A"), "\uFFFDA"},
		"leader split then ascii": {[]byte("\xf0\x9fA"), "\uFFFD\uFFFDA"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			for cut := 0; cut <= len(tc.in); cut++ {
				require.Equal(t, tc.want, strings.Join(chunkAt(tc.in, []int{cut}), ""), "cut at %d", cut)
			}
		})
	}
}

func FuzzUTF8Chunker(f *testing.F) {
	f.Add([]byte("hello, world"), []byte{3, 7})
	f.Add([]byte("a€b😀c"), []byte{2, 1, 1})
	f.Add([]byte("\xe2\x82\xac\xff\xf0\x9f\x98"), []byte{1, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data, steps []byte) {
		var cuts []int
		pos := 0
		for _, s := range steps {
			pos += int(s % 8)
			cuts = append(cuts, pos)
		}
		chunks := chunkAt(data, cuts)
		for _, ch := range chunks {
			if !utf8.ValidString(ch) {
				t.Fatalf("chunk %q is not valid UTF-8", ch)
			}
		}
		if got, want := strings.Join(chunks, ""), referenceText(data); got != want {
			t.Fatalf("chunked %q, want %q", got, want)
		}
	})
}
