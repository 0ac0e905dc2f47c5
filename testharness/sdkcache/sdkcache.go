package sdkcache

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/internal/cachedir"
)

//go:embed sdk.pin
var pin string

// DirEnv names the directory holding <version>/claude; without it, Find
// looks in the user's cache (scripts/fetch-sdk.sh's default).
const DirEnv = "COWORK_VMM_SDK_CACHE"

// SDK is a fetched build of the CLI.
type SDK struct {
	// Dir holds Version/claude: installSdk's sdkSubpath is Dir without
	// its leading slash.
	Dir     string
	Version string
}

// Binary is the executable's path.
func (s SDK) Binary() string { return filepath.Join(s.Dir, s.Version, "claude") }

// Version is the pinned version.
func Version() string {
	for _, line := range strings.Split(pin, "\n") {
		if v, ok := strings.CutPrefix(line, "SDK_VERSION="); ok {
			return strings.TrimSpace(v)
		}
	}
	panic("sdkcache: sdk.pin names no SDK_VERSION") // the embedded file is ours
}

// DefaultDir is where scripts/fetch-sdk.sh puts builds unless DirEnv says
// otherwise.
func DefaultDir() (string, error) { return cachedir.Dir(DirEnv, "sdk") }

// Find returns the pinned build, or an error that says how to fetch it.
func Find() (SDK, error) {
	dir, err := DefaultDir()
	if err != nil {
		return SDK{}, fmt.Errorf("sdkcache: no cache directory: %w", err)
	}
	s := SDK{Dir: dir, Version: Version()}
	fi, err := os.Stat(s.Binary())
	if err != nil {
		return SDK{}, fmt.Errorf("the Claude Code CLI %s is not fetched (scripts/fetch-sdk.sh, which .ci/run runs, needs npm): %w", s.Version, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return SDK{}, errors.New("sdkcache: " + s.Binary() + " is not an executable file")
	}
	return s, nil
}
