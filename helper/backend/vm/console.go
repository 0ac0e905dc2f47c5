package vm

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// Console tail bounds: lines kept for error messages, and the longest line
// kept (the guest controls what it prints).
const (
	consoleTailLines = 64
	consoleLineMax   = 512
)

// console receives the guest's serial output: each line is logged at debug
// level and the last consoleTailLines lines are kept, so an error about
// the guest's death can show what the guest said last. Safe for concurrent
// use (the UART flushes from its own goroutine).
type console struct {
	log  *slog.Logger
	copy io.Writer // nil: lines are only logged

	mu      sync.Mutex
	partial []byte
	lines   []string // ring of the last lines, oldest at next
	next    int
	full    bool
	panics  bool // a kernel panic was printed
}

func newConsole(log *slog.Logger, copy io.Writer) *console {
	return &console{log: log, copy: copy, lines: make([]string, consoleTailLines)}
}

// Write implements io.Writer. It never fails.
func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			room := consoleLineMax - len(c.partial)
			c.partial = append(c.partial, p[:max(0, min(room, len(p)))]...)
			break
		}
		room := consoleLineMax - len(c.partial)
		c.partial = append(c.partial, p[:max(0, min(room, i))]...)
		c.endLineLocked()
		p = p[i+1:]
	}
	return n, nil
}

func (c *console) endLineLocked() {
	line := strings.ToValidUTF8(strings.TrimRight(string(c.partial), "\r"), "\uFFFD")
	c.partial = c.partial[:0]
	if strings.Contains(line, "Kernel panic") {
		c.panics = true
	}
	c.log.Debug("guest console", "line", line)
	if c.copy != nil {
		_, _ = io.WriteString(c.copy, line+"\n") // a failing log sink must not stall the UART
	}
	c.lines[c.next] = line
	c.next = (c.next + 1) % len(c.lines)
	if c.next == 0 {
		c.full = true
	}
}

// Tail returns the last lines the guest printed (and any unfinished line),
// oldest first, joined by newlines.
func (c *console) Tail() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	if c.full {
		out = append(out, c.lines[c.next:]...)
	}
	out = append(out, c.lines[:c.next]...)
	if len(c.partial) > 0 {
		out = append(out, strings.ToValidUTF8(string(c.partial), "\uFFFD"))
	}
	return strings.Join(out, "\n")
}

// Panicked reports whether the guest printed a kernel panic.
func (c *console) Panicked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.panics
}
