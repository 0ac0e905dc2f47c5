package kernel

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBuiltGuestConfig: the built guest kernel has what the VMM's devices
// need, the balloon with free page reporting among them (issue #44), and
// every option its fragments set. It skips when no guest kernel is built.
func TestBuiltGuestConfig(t *testing.T) {
	path, err := FindImage(Guest, "config")
	if err != nil {
		t.Skipf("no built guest kernel to check: %v", err)
	}
	config := readConfig(t, path)
	for _, opt := range []string{"CONFIG_VIRTIO_BALLOON", "CONFIG_PAGE_REPORTING", "CONFIG_VIRTIO_MMIO", "CONFIG_VIRTIO_FS", "CONFIG_VIRTIO_VSOCKETS"} {
		assert.Equal(t, "y", config[opt], "%s in %s", opt, path)
	}
	for _, fragment := range []string{"guest.fragment", "guest-only.fragment"} {
		for opt, want := range readConfig(t, fragment) {
			assert.Equal(t, want, config[opt], "%s (%s) in %s", opt, fragment, path)
		}
	}
}

// readConfig reads a kernel config or fragment: each CONFIG_X=value line,
// and "# CONFIG_X is not set" as value "n".
func readConfig(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if name, ok := strings.CutPrefix(line, "# "); ok {
			if opt, ok := strings.CutSuffix(name, " is not set"); ok && strings.HasPrefix(opt, "CONFIG_") {
				out[opt] = "n"
			}
			continue
		}
		if opt, value, ok := strings.Cut(line, "="); ok && strings.HasPrefix(opt, "CONFIG_") {
			out[opt] = value
		}
	}
	require.NoError(t, sc.Err())
	return out
}
