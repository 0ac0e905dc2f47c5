package nested

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFiguresRecordedAndFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "figures")
	t.Setenv(FiguresEnv, path)
	RecordFigures(t, "SDK a: 1 s", "SDK b: 2 s")
	RecordFigures(t, "SDK c: 3 s")
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "SDK a: 1 s\nSDK b: 2 s\nSDK c: 3 s\n", string(got))

	out := "=== RUN\n    sdk_test.go:9: SDK x: 4 s\r\nother line\n    sdk_test.go:9: SDK y\n"
	assert.Equal(t, []string{"SDK x: 4 s", "SDK y"}, FiguresIn(out, "SDK "))
	assert.Empty(t, FiguresIn(out, "NOPE "))
}
