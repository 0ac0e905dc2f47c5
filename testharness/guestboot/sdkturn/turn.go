package sdkturn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/fakeapi"
)

// Mode is how a turn drives the CLI.
type Mode string

// The modes.
const (
	// ModePrint is `claude -p Prompt` with stdin closed (/dev/null).
	ModePrint Mode = "print"
	// ModeStream is the desktop client's stream-json mode: one user
	// message line on stdin, which is closed once the result line is out.
	ModeStream Mode = "stream"
)

// Prompt is every turn's user text: the fake API answers
// fakeapi.AnswerPrefix + Prompt.
const Prompt = "say hi"

// DefaultTimeout bounds one turn: nested, on a loaded machine, a cold one
// took 51 s natively in the outer guest.
const DefaultTimeout = 5 * time.Minute

// Args are the CLI's arguments in mode m.
func Args(m Mode) []string {
	if m == ModeStream {
		return []string{"-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"}
	}
	return []string{"-p", Prompt}
}

// APIEnv is what points the CLI at the fake API at apiURL: its URL, a key
// it ignores, no retries (a failed turn fails at once), and neither
// telemetry nor any other traffic than the turn's. The e2e tests spawn the
// CLI through the helper with it.
func APIEnv(apiURL string) map[string]string {
	return map[string]string{
		"ANTHROPIC_BASE_URL":                       apiURL,
		"ANTHROPIC_API_KEY":                        "sk-test",
		"DISABLE_TELEMETRY":                        "1",
		"DISABLE_AUTOUPDATER":                      "1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
		"CLAUDE_CODE_MAX_RETRIES":                  "0",
	}
}

// Env is the CLI's whole environment: its HOME, a PATH and APIEnv.
func Env(home, apiURL string) []string {
	env := []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C.UTF-8"}
	for k, v := range APIEnv(apiURL) {
		env = append(env, k+"="+v)
	}
	return env
}

// StreamMessage is the stream-json line of a user message saying text.
func StreamMessage(text string) []byte {
	b, _ := json.Marshal(map[string]any{"type": "user", "message": map[string]any{
		"role": "user", "content": []any{map[string]string{"type": "text", "text": text}}}})
	return append(b, '\n')
}

// Spec is one turn.
type Spec struct {
	// Binary is the CLI as the process sees it (inside Chroot, if set).
	Binary string
	Mode   Mode
	// Home is the CLI's HOME and working directory, as it sees it.
	Home   string
	APIURL string
	// Chroot, when set, is the root the CLI runs in.
	Chroot string
	// Timeout bounds the turn (default DefaultTimeout).
	Timeout time.Duration
	// Start, when set, wraps the process's start (the guest gives the CLI
	// the default timer slack with it).
	Start func(start func() error) error
}

// Timing is what one turn measured from the spawn: the first byte that
// counts (stdout's first in ModePrint, the result line's first in
// ModeStream) and the exit.
type Timing struct {
	FirstByte, Exit time.Duration
}

// Run runs one turn, times it and checks its answer.
func Run(ctx context.Context, s Spec) (Timing, error) {
	if s.Timeout <= 0 {
		s.Timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Binary, Args(s.Mode)...)
	cmd.Env = Env(s.Home, s.APIURL)
	cmd.Dir = s.Home
	if s.Chroot != "" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: s.Chroot}
	}
	cmd.WaitDelay = 2 * time.Second
	out := newOutputClock(time.Now)
	stderr := &tailBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = out, stderr
	var stdin io.WriteCloser
	if s.Mode == ModeStream {
		var err error
		if stdin, err = cmd.StdinPipe(); err != nil {
			return Timing{}, err
		}
	}
	start := s.Start
	if start == nil {
		start = func(f func() error) error { return f() }
	}
	out.start = time.Now()
	if err := start(cmd.Start); err != nil {
		return Timing{}, fmt.Errorf("starting %s: %w", s.Binary, err)
	}
	exited := make(chan struct{})
	if stdin != nil {
		go feedStream(stdin, out.resultSeen, exited)
	}
	err := cmd.Wait()
	close(exited)
	t := Timing{Exit: time.Since(out.start)}
	return out.timing(t, s.Mode, err, ctx.Err(), stderr.String())
}

// feedStream writes the user message, then closes stdin at the result
// line or the CLI's exit, whichever comes first.
func feedStream(stdin io.WriteCloser, result, exited <-chan struct{}) {
	_, _ = stdin.Write(StreamMessage(Prompt))
	select {
	case <-result:
	case <-exited:
	}
	_ = stdin.Close()
}

// timing completes t from what the CLI printed and how it ended, or says
// why the turn failed.
func (c *outputClock) timing(t Timing, mode Mode, waitErr, ctxErr error, stderr string) (Timing, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want := fakeapi.AnswerPrefix + Prompt
	why := func(format string, args ...any) (Timing, error) {
		msg := fmt.Sprintf(format, args...)
		if s := lastLines(stderr, 3); s != "" {
			msg += "; stderr: " + s
		}
		return t, errors.New(msg)
	}
	switch {
	case ctxErr != nil:
		return why("the CLI did not finish within its time: %v", ctxErr)
	case waitErr != nil:
		return why("the CLI failed: %v", waitErr)
	case mode == ModePrint && !c.sawFirst:
		return why("the CLI printed nothing")
	case mode == ModePrint && strings.TrimSpace(string(c.head)) != want:
		return why("the CLI printed %q, want %q", truncate(string(c.head), 200), want)
	case mode == ModePrint:
		t.FirstByte = c.first
	case !c.sawResult:
		return why("no result line in the CLI's stream-json output (it began %q)", truncate(string(c.head), 200))
	case c.result.IsError || c.result.Result != want:
		return why("the result line says is_error=%v, result %q; want %q", c.result.IsError, truncate(c.result.Result, 200), want)
	default:
		t.FirstByte = c.resultAt
	}
	return t, nil
}

// resultLine is what a turn reads of a stream-json result line.
type resultLine struct {
	Type    string `json:"type"`
	IsError bool   `json:"is_error"`
	Result  string `json:"result"`
}

// Bounds on what outputClock keeps of the CLI's output.
const (
	maxLine = 1 << 20 // a stream-json line: the longer ones are no result
	maxHead = 4 << 10 // the start of the output, for the print answer and errors
)

// outputClock is the CLI's stdout: it notes when the first byte arrived
// and, for stream-json, when the first byte of the first result line did.
// Times are from start, read with now at each write.
type outputClock struct {
	now   func() time.Time
	start time.Time

	mu        sync.Mutex
	sawFirst  bool
	first     time.Duration
	head      []byte
	line      []byte
	inLine    bool
	lineLong  bool // the line outgrew maxLine
	lineStart time.Duration

	sawResult  bool
	resultAt   time.Duration
	result     resultLine
	resultSeen chan struct{} // closed at the result line
}

func newOutputClock(now func() time.Time) *outputClock {
	return &outputClock{now: now, start: now(), resultSeen: make(chan struct{})}
}

// Write implements io.Writer.
func (c *outputClock) Write(p []byte) (int, error) {
	at := c.now().Sub(c.start)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(p) > 0 && !c.sawFirst {
		c.sawFirst, c.first = true, at
	}
	if room := maxHead - len(c.head); room > 0 {
		c.head = append(c.head, p[:min(room, len(p))]...)
	}
	for rest := p; len(rest) > 0; {
		if !c.inLine {
			c.inLine, c.lineStart = true, at
		}
		chunk, tail, ended := bytes.Cut(rest, []byte{'\n'})
		if len(c.line)+len(chunk) > maxLine {
			c.lineLong = true
		} else if !c.lineLong {
			c.line = append(c.line, chunk...)
		}
		if !ended {
			break
		}
		c.endLine()
		rest = tail
	}
	return len(p), nil
}

// endLine notes a complete line: the first result line's time and fields.
func (c *outputClock) endLine() {
	var r resultLine
	if !c.sawResult && !c.lineLong && json.Unmarshal(c.line, &r) == nil && r.Type == "result" {
		c.sawResult, c.resultAt, c.result = true, c.lineStart, r
		close(c.resultSeen)
	}
	c.line, c.inLine, c.lineLong = c.line[:0], false, false
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
