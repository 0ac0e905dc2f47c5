package acceptlooptest

import (
	"bytes"
	"log/slog"
	"sync"
)

// LogBuffer collects the text log lines of a server under test, written
// from many goroutines.
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
