package bundle

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFindUsesTheEnvironmentsDirectory(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(DirEnv, dir)
	_, err := Find()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "make bundle")

	for _, name := range []string{RootImage, DataImage} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644))
	}
	_, err = Find()
	require.Error(t, err, "no info file: an unfinished build")

	require.NoError(t, os.WriteFile(filepath.Join(dir, InfoFile), nil, 0o644))
	_, err = Find()
	require.ErrorContains(t, err, "not a non-empty regular file")

	require.NoError(t, os.WriteFile(filepath.Join(dir, InfoFile), []byte("hash=x\n"), 0o644))
	b, err := Find()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, RootImage), b.RootImagePath())
	assert.Equal(t, filepath.Join(dir, DataImage), b.DataImagePath())
}

func TestDefaultDirIsTheCachesCurrentBuild(t *testing.T) {
	cache := t.TempDir()
	t.Setenv(DirEnv, "")
	t.Setenv("XDG_CACHE_HOME", cache)
	dir, err := DefaultDir()
	require.NoError(t, err)
	// Where scripts/make-bundle.sh links its current build.
	assert.Equal(t, filepath.Join(cache, "cowork-vmm", "bundles", "current"), dir)
}

// skipRecorder is a testing.TB whose Skip records its reason and returns.
type skipRecorder struct {
	testing.TB
	reason string
}

func (r *skipRecorder) Helper()              {}
func (r *skipRecorder) Skip(args ...any)     { r.reason = args[0].(string) }
func (r *skipRecorder) Skipf(string, ...any) { panic("unused") }

func TestRequireSkipsSayingWhy(t *testing.T) {
	t.Setenv(DirEnv, t.TempDir())
	rec := &skipRecorder{}
	Require(rec)
	assert.Contains(t, rec.reason, "the stand-in bundle is not built")
}
