package agent

import (
	"fmt"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/protocol/agentrpc/agenttest"
)

// BenchmarkOutputThroughput measures stdout forwarding: a process writes
// 8 MiB of text, the client receives it as events.
func BenchmarkOutputThroughput(b *testing.B) {
	const size = 8 * 1024 * 1024
	c := startAgent(b, Options{})
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bench%d", i)
		c.spawn(id, "sh", "-c", fmt.Sprintf("yes 'some typical output text' | head -c %d", size))
		p := c.WaitExit(id)
		if p.Stdout.Len() != size {
			b.Fatalf("got %d bytes, want %d", p.Stdout.Len(), size)
		}
		c.Locked(func(procs map[string]*agenttest.Output) { delete(procs, id) })
	}
}

func BenchmarkUTF8Chunker(b *testing.B) {
	data := []byte(stringsRepeat("héllo wörld € 😀 ", 4096))
	b.SetBytes(int64(len(data)))
	for i := 0; i < b.N; i++ {
		var c utf8Chunker
		for off := 0; off < len(data); off += 4093 {
			_ = c.Push(data[off:min(off+4093, len(data))])
		}
		_ = c.Flush()
	}
}

func stringsRepeat(s string, n int) string {
	out := make([]byte, 0, len(s)*n)
	for range n {
		out = append(out, s...)
	}
	return string(out)
}
