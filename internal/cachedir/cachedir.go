package cachedir

import (
	"fmt"
	"os"
	"path/filepath"
)

// Dir is the cache directory of one kind: $env (made absolute) when env
// names a set variable, else $XDG_CACHE_HOME/cowork-vmm/<sub...>, else
// $HOME/.cache/cowork-vmm/<sub...>. The directory is not created.
func Dir(env string, sub ...string) (string, error) {
	if env != "" {
		if d := os.Getenv(env); d != "" {
			return filepath.Abs(d)
		}
	}
	base, err := os.UserCacheDir()
	if err != nil {
		if env != "" {
			return "", fmt.Errorf("no cache directory (set %s, or HOME): %w", env, err)
		}
		return "", fmt.Errorf("no cache directory (set HOME): %w", err)
	}
	return filepath.Join(append([]string{base, "cowork-vmm"}, sub...)...), nil
}
