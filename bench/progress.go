package bench

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// progress shows what the bench is doing: on a terminal one line,
// rewritten in place (\r); elsewhere (a log, a pipe) only the lines that
// stay — notes and failures — so logs are not filled with updates.
type progress struct {
	w     io.Writer
	tty   bool
	dirty bool // a status line is showing
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

// status replaces the status line (terminal only).
func (p *progress) status(format string, args ...any) {
	if !p.tty {
		return
	}
	fmt.Fprintf(p.w, "\r\033[Kcowork-bench: "+format, args...)
	p.dirty = true
}

// line prints a line that stays, above the status line.
func (p *progress) line(format string, args ...any) {
	p.clear()
	fmt.Fprintf(p.w, "cowork-bench: "+format+"\n", args...)
}

// clear removes the status line.
func (p *progress) clear() {
	if p.dirty {
		fmt.Fprint(p.w, "\r\033[K")
		p.dirty = false
	}
}
