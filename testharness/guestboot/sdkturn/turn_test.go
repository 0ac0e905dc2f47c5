package sdkturn

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/testharness/fakeapi"
	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

// fakeNow is a clock the test moves.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time { return f.t }

func TestOutputClockFirstByteAndResultLine(t *testing.T) {
	clock := &fakeNow{t: time.Unix(100, 0)}
	c := newOutputClock(clock.now)
	write := func(after time.Duration, s string) {
		clock.t = clock.t.Add(after)
		n, err := c.Write([]byte(s))
		require.NoError(t, err)
		require.Equal(t, len(s), n)
	}
	write(10*time.Millisecond, `{"type":"system","subtype":"init"}`+"\n"+`{"type":"assistant",`)
	write(5*time.Millisecond, `"message":{}}`+"\n")
	require.False(t, c.sawResult, "no result line yet")
	// The result line starts in one write and ends in a later one: its
	// time is its first byte's.
	write(20*time.Millisecond, `{"type":"result","is_error":false,`)
	select {
	case <-c.resultSeen:
		t.Fatal("the result line is not complete yet")
	default:
	}
	write(30*time.Millisecond, `"result":"`+fakeapi.AnswerPrefix+Prompt+`"}`+"\n"+`{"type":"result","result":"second"}`+"\n")
	<-c.resultSeen
	require.Equal(t, 10*time.Millisecond, c.first)
	require.Equal(t, 35*time.Millisecond, c.resultAt, "the first byte of the result line")
	require.Equal(t, fakeapi.AnswerPrefix+Prompt, c.result.Result, "the first result line counts")
	got, err := c.timing(Timing{Exit: time.Second}, ModeStream, nil, nil, "")
	require.NoError(t, err)
	require.Equal(t, Timing{FirstByte: 35 * time.Millisecond, Exit: time.Second}, got)
}

func TestOutputClockIgnoresWhatIsNoResultLine(t *testing.T) {
	c := newOutputClock(time.Now)
	for _, s := range []string{
		`{"type":"result"` + "\n", // not JSON
		`["type","result"]` + "\n",
		`{"type":"results"}` + "\n",
		`{"type":"result","result":"` + strings.Repeat("x", maxLine) + `"}` + "\n", // longer than a line may be
		"\n\n",
		`{"type":"result","result":"unterminated"}`, // no newline yet
	} {
		_, err := c.Write([]byte(s))
		require.NoError(t, err)
		require.False(t, c.sawResult, s[:min(len(s), 40)])
	}
	require.LessOrEqual(t, len(c.line), maxLine)
	require.Len(t, c.head, maxHead)
	_, err := c.timing(Timing{}, ModeStream, nil, nil, "boom\n")
	require.ErrorContains(t, err, "no result line")
	require.ErrorContains(t, err, "stderr: boom")
}

func TestTimingChecksTheAnswer(t *testing.T) {
	answer := fakeapi.AnswerPrefix + Prompt + "\n"
	c := newOutputClock(time.Now)
	_, _ = c.Write([]byte(answer))
	got, err := c.timing(Timing{Exit: 2 * time.Second}, ModePrint, nil, nil, "")
	require.NoError(t, err)
	require.Equal(t, c.first, got.FirstByte)

	wrong := newOutputClock(time.Now)
	_, _ = wrong.Write([]byte("Invalid API key\n"))
	_, err = wrong.timing(Timing{}, ModePrint, nil, nil, "")
	require.ErrorContains(t, err, `printed "Invalid API key\n"`)
	_, err = newOutputClock(time.Now).timing(Timing{}, ModePrint, nil, nil, "")
	require.ErrorContains(t, err, "printed nothing")
	_, err = c.timing(Timing{}, ModePrint, os.ErrClosed, nil, "")
	require.ErrorContains(t, err, "the CLI failed")
	_, err = c.timing(Timing{}, ModePrint, nil, context.DeadlineExceeded, "")
	require.ErrorContains(t, err, "did not finish")

	failed := newOutputClock(time.Now)
	_, _ = failed.Write([]byte(`{"type":"result","is_error":true,"result":"API Error"}` + "\n"))
	_, err = failed.timing(Timing{}, ModeStream, nil, nil, "")
	require.ErrorContains(t, err, `is_error=true, result "API Error"`)
}

// fakeCLI writes a shell script that behaves like the CLI in both modes:
// print mode answers at once; stream-json mode reads the user line,
// prints an init line and the result line, then waits for the end of its
// input, as the real CLI does.
func fakeCLI(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh for the fake CLI")
	}
	answer := fakeapi.AnswerPrefix + Prompt
	script := `#!/bin/sh
[ "$ANTHROPIC_API_KEY" = sk-test ] || { echo "no key" >&2; exit 3; }
pwd > "$HOME/ran-in"
if [ "$2" = "--input-format" ]; then
	read -r line
	echo '{"type":"system","subtype":"init"}'
	echo '{"type":"result","is_error":false,"result":"` + answer + `"}'
	cat > /dev/null
	exit 0
fi
echo "` + answer + `"
`
	path := filepath.Join(t.TempDir(), "claude")
	require.NoError(t, os.WriteFile(path, []byte(script), 0o755))
	return path
}

func TestRunBothModes(t *testing.T) {
	bin := fakeCLI(t)
	home := t.TempDir()
	for _, mode := range []Mode{ModePrint, ModeStream} {
		got, err := Run(t.Context(), Spec{Binary: bin, Mode: mode, Home: home, APIURL: "http://127.0.0.1:1", Timeout: 20 * time.Second})
		require.NoError(t, err, mode)
		require.Positive(t, got.FirstByte, mode)
		require.GreaterOrEqual(t, got.Exit, got.FirstByte, mode)
		wd, err := os.ReadFile(filepath.Join(home, "ran-in"))
		require.NoError(t, err)
		require.Equal(t, home, strings.TrimSpace(string(wd)), "HOME is the working directory")
	}
}

func TestRunBoundsACLIThatNeverEnds(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	bin := filepath.Join(t.TempDir(), "claude")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755))
	start := time.Now()
	_, err := Run(t.Context(), Spec{Binary: bin, Mode: ModeStream, Home: t.TempDir(), Timeout: 300 * time.Millisecond})
	require.ErrorContains(t, err, "did not finish within its time")
	require.Less(t, time.Since(start), 10*time.Second)
}

func TestBootRunsEveryTurnColdThenWarm(t *testing.T) {
	bin := fakeCLI(t)
	dir := t.TempDir()
	drops := 0
	b := Boot{Binary: bin, HomeDir: dir, APIURL: "http://127.0.0.1:1", Timeout: 20 * time.Second,
		DropCaches: func() error { drops++; return nil }}
	var bounds []string
	b.OnTurn = func(turn Turn, begin bool) { bounds = append(bounds, fmt.Sprintf("%s %v", turn.ID, begin)) }
	var got []fsbench.Result
	b.Run(t.Context(), func(r fsbench.Result) { got = append(got, r) })
	require.Len(t, got, len(Turns))
	for i, r := range got {
		require.Equal(t, Turns[i].ID, r.Workload)
		require.Empty(t, r.Err, r.Workload)
		require.Positive(t, r.Values[KeyFirstByte], r.Workload)
		require.GreaterOrEqual(t, r.Values[KeyExit], r.Values[KeyFirstByte], r.Workload)
	}
	require.Equal(t, 2, drops, "one drop before each cold turn")
	require.Equal(t, []string{"print_cold true", "print_cold false", "print_warm true", "print_warm false",
		"stream_cold true", "stream_cold false", "stream_warm true", "stream_warm false"}, bounds)
	require.DirExists(t, filepath.Join(dir, "home-print"))
	require.DirExists(t, filepath.Join(dir, "home-stream"))

	// A missing binary fails every turn with the reason, and the boot goes on.
	b.Binary = filepath.Join(dir, "missing")
	got = nil
	b.Run(t.Context(), func(r fsbench.Result) { got = append(got, r) })
	require.Len(t, got, len(Turns))
	for _, r := range got {
		require.Contains(t, r.Err, "starting")
	}
}

func TestServeAnswersOnTheLoopback(t *testing.T) {
	url, stop, err := Serve()
	require.NoError(t, err)
	defer stop()
	require.True(t, strings.HasPrefix(url, "http://127.0.0.1:"), url)
}
