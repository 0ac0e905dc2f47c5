package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runClientCmd runs `cowork-vmm client ARGS…` beside the harness's helper and
// returns its exit status, stdout and stderr.
func runClientCmd(t *testing.T, h *harness, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(h.cmd.Path, append([]string{"client"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	} else {
		require.NoError(t, err)
	}
	assert.NotContains(t, stderr.String(), "WARNING: DATA RACE")
	return code, stdout.String(), stderr.String()
}

// TestClientCmd is the README's "session through the socket": a helper
// serving its socket, and `cowork-vmm client` running commands through it.
func TestClientCmd(t *testing.T) {
	backend := e2eBackend(t)
	h := startHelper(t, backend)

	code, stdout, stderr := runClientCmd(t, h, nil, "--socket", h.socket, "--", "sh", "-c", "echo hi; exit 3")
	assert.Equal(t, 3, code, "the command's exit status; stderr: %s", stderr)
	assert.Equal(t, "hi\n", stdout)
	assert.Empty(t, stderr)
	assert.True(t, h.oneShot("isRunning", nil).Success)
	assert.JSONEq(t, `{"running":true}`, string(h.oneShot("isRunning", nil).Result), "the guest stays up for the next call")

	// The default socket is $XDG_RUNTIME_DIR/claude-cowork-vm.sock, where
	// the helper serves; the session's home persists between calls; a
	// signal's status is 128+n; --stop-vm stops the guest afterwards.
	env := []string{"XDG_RUNTIME_DIR=" + filepath.Dir(h.socket)}
	code, stdout, stderr = runClientCmd(t, h, env, "--session", "readme", "--", "sh", "-c", "echo kept > note; pwd")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "/sessions/readme\n", stdout)
	code, stdout, stderr = runClientCmd(t, h, env, "--session", "readme", "--stop-vm", "--", "sh", "-c", "cat note; kill -TERM $$")
	assert.Equal(t, 128+15, code, stderr)
	assert.Equal(t, "kept\n", stdout)
	assert.JSONEq(t, `{"running":false}`, string(h.oneShot("isRunning", nil).Result))

	// Without a helper: a message that says how to start one.
	missing := filepath.Join(t.TempDir(), "none.sock")
	code, _, stderr = runClientCmd(t, h, nil, "--socket", missing, "--", "true")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "no helper listening at "+missing+"; start one with `cowork-vmm -socket "+missing+"`")
}
