package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/guest/agent"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/process"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// runTestAgentEnv makes the re-executed test binary act as `cowork-vmm
// agent` for the process backend's guests.
const runTestAgentEnv = "COWORK_VMM_RUN_TEST_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(runTestAgentEnv) == "1" && len(os.Args) > 1 && os.Args[1] == "agent" {
		os.Exit(agent.ProcessMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

type offlineProbe struct{}

func (offlineProbe) Do(*http.Request) (*http.Response, error) {
	return nil, errors.New("no network in tests")
}

// processService is a stateless helper profile on the process backend,
// with this test binary as the agent.
func processService(t *testing.T) *helper.Service {
	t.Helper()
	factories := map[string]helper.BackendFactory{helper.BackendProcess: func() (helper.Backend, error) {
		return process.New(process.Options{Env: []string{runTestAgentEnv + "=1"}}), nil
	}}
	h, err := helper.New(helper.Options{Backend: helper.BackendProcess, Backends: factories, DataDir: t.TempDir(), Stateless: true,
		NetworkCheck: func(context.Context) string { return protocol.NetworkConnected }, ProbeClient: offlineProbe{}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	svc, err := h.Profile(runProfile, "")
	require.NoError(t, err)
	return svc
}

// run's stdin at its end ends the command's input: a cat ends, where
// before it waited for input that never came (timeout(1) bounds it).
func TestRunForwardsEndOfInput(t *testing.T) {
	svc := processService(t)
	var stdout, stderr bytes.Buffer
	o := runOptions{command: []string{"timeout", "10", "sh", "-c", "cat; echo done"}}
	start := time.Now()
	code, err := runInGuest(t.Context(), svc, o, strings.NewReader("the input\n"), &stdout, &stderr)
	var notStarted *startError
	if errors.As(err, &notStarted) {
		t.Skipf("the process backend's sandbox did not start here (it needs user namespaces): %v", err)
	}
	require.NoError(t, err, "stderr: %s", stderr.String())
	assert.Equal(t, "the input\ndone\n", stdout.String())
	assert.Equal(t, 0, code, "the command should end with its input, not by timeout(1)")
	t.Logf("run took %v", time.Since(start))
}
