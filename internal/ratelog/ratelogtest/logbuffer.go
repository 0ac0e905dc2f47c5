// Package ratelogtest collects log lines in tests, to check what a server or
// a device logs and that a flood of events is rate-limited.
package ratelogtest

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// LogBuffer collects the text log lines of a server or device under test,
// written from many goroutines.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Logger returns a text logger writing into b at debug level.
func (b *LogBuffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Write implements io.Writer.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines returns the lines written so far that contain substr ("" for all).
func (b *LogBuffer) Lines(substr string) []string {
	var lines []string
	for line := range strings.Lines(b.String()) {
		if strings.Contains(line, substr) {
			lines = append(lines, strings.TrimSuffix(line, "\n"))
		}
	}
	return lines
}
