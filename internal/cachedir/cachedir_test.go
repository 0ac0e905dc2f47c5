package cachedir

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDir: the variable wins, made absolute; else the user's cache
// directory; neither set is an error that names the variable.
func TestDir(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/cache")
	t.Setenv("COWORK_TEST_CACHE", "")
	d, err := Dir("COWORK_TEST_CACHE", "sdk")
	require.NoError(t, err)
	assert.Equal(t, "/cache/cowork-vmm/sdk", d)
	d, err = Dir("", "bundles", "current")
	require.NoError(t, err)
	assert.Equal(t, "/cache/cowork-vmm/bundles/current", d)

	t.Setenv("COWORK_TEST_CACHE", "rel")
	d, err = Dir("COWORK_TEST_CACHE", "sdk")
	require.NoError(t, err)
	want, _ := filepath.Abs("rel")
	assert.Equal(t, want, d)

	t.Setenv("COWORK_TEST_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "")
	_, err = Dir("COWORK_TEST_CACHE", "sdk")
	assert.ErrorContains(t, err, "COWORK_TEST_CACHE")
}
