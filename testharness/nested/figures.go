package nested

import (
	"os"
	"strings"
	"testing"
)

// FiguresEnv names a file tests append the figures they measured to, one
// line each, so that CI prints them whether or not it runs go test -v
// (.ci/run prints the file after make test).
const FiguresEnv = "COWORK_VMM_FIGURES"

// RecordFigures logs lines and appends them to the FiguresEnv file when it
// is set.
func RecordFigures(t testing.TB, lines ...string) {
	t.Helper()
	for _, l := range lines {
		t.Log(l)
	}
	path := os.Getenv(FiguresEnv)
	if path == "" {
		return
	}
	if err := appendLedger(path, lines); err != nil {
		t.Errorf("figures file: %v", err)
	}
}

// FiguresIn returns the text after marker on each line of output that
// holds it: the figures an inner test logged, for RecordFigures outside.
func FiguresIn(output, marker string) []string {
	var out []string
	for _, line := range strings.Split(output, "\n") {
		if _, after, ok := strings.Cut(line, marker); ok {
			out = append(out, marker+strings.TrimRight(after, "\r"))
		}
	}
	return out
}
