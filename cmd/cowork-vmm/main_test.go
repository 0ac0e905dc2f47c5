package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/helper"
)

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	assert.Equal(t, 0, dispatch([]string{"version"}, &out, io.Discard))
	assert.Contains(t, out.String(), "cowork-vmm dev (commit unknown, go1.")
	// A plain `go test` build embeds no kernel (make build does).
	assert.Contains(t, out.String(), "guest kernel: not embedded")
}

func TestHelpListsSubcommandsAndEnvironment(t *testing.T) {
	for _, arg := range []string{"help", "-h", "--help"} {
		var out bytes.Buffer
		assert.Equal(t, 0, dispatch([]string{arg}, &out, io.Discard))
		for _, want := range []string{"-socket PATH", "run [flags] -- CMD", "version", "COWORK_VMM_BACKEND", "XDG_RUNTIME_DIR", "XDG_DATA_HOME", "Examples:"} {
			assert.Contains(t, out.String(), want, arg)
		}
	}
}

func TestBadInvocations(t *testing.T) {
	var errOut bytes.Buffer
	assert.Equal(t, 2, dispatch([]string{"frobnicate"}, io.Discard, &errOut))
	assert.Contains(t, errOut.String(), `unknown subcommand "frobnicate"`)
	assert.Equal(t, 2, dispatch(nil, io.Discard, io.Discard), "helper mode needs -socket")
	assert.Equal(t, 2, dispatch([]string{"-socket"}, io.Discard, io.Discard))
	assert.Equal(t, 2, dispatch([]string{"run"}, io.Discard, io.Discard), "run needs a command")
	assert.Equal(t, 2, dispatch([]string{"run", "--mount", "nocolon", "--", "true"}, io.Discard, io.Discard))
}

func TestParseMount(t *testing.T) {
	m, err := parseMount("/src:/dst")
	require.NoError(t, err)
	assert.Equal(t, runMount{host: "/src", guest: "/dst"}, m)
	m, err = parseMount("rel:/dst:ro")
	require.NoError(t, err)
	assert.Equal(t, runMount{host: "rel", guest: "/dst", readOnly: true}, m)
	for _, bad := range []string{"/src", "/src:rel", ":/dst", "/a:/b:rx", "/a:/b:ro:x"} {
		_, err := parseMount(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseRunArgs(t *testing.T) {
	o, err := parseRunArgs([]string{"--mount", "/a:/b", "--mount", "/c:/d:ro", "--env", "K=V=W", "--workdir", "/b", "--", "ls", "-l"}, io.Discard)
	require.NoError(t, err)
	assert.Len(t, o.mounts, 2)
	assert.Equal(t, map[string]string{"K": "V=W"}, o.env)
	assert.Equal(t, "/b", o.workdir)
	assert.Equal(t, []string{"ls", "-l"}, o.command)
}

func TestParseRunArgsBundle(t *testing.T) {
	o, err := parseRunArgs([]string{"--bundle", "/b/../bundle", "--", "true"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "/bundle", o.bundle)
	o, err = parseRunArgs([]string{"--", "true"}, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, o.bundle)
}

func TestParseRunArgsKernelModes(t *testing.T) {
	// --kernel with a command: the kvm backend's kernel, through the agent.
	o, err := parseRunArgs([]string{"--kernel", "/k", "--", "true"}, io.Discard)
	require.NoError(t, err)
	assert.False(t, o.rawBoot())
	// --kernel with --initrd (or --cmdline, or no command): a direct boot.
	for _, args := range [][]string{
		{"--kernel", "/k", "--initrd", "/i"},
		{"--kernel", "/k", "--cmdline", "loglevel=7", "--mem", "256", "--cpus", "2"},
		{"--kernel", "/k"},
	} {
		o, err := parseRunArgs(args, io.Discard)
		require.NoError(t, err, args)
		assert.True(t, o.rawBoot(), args)
	}
	// Refused: direct-boot flags without a kernel, or with a command.
	for _, args := range [][]string{
		{"--initrd", "/i", "--", "true"},
		{"--cmdline", "x", "--", "true"},
		{"--kernel", "/k", "--initrd", "/i", "--", "true"},
	} {
		_, err := parseRunArgs(args, io.Discard)
		assert.Error(t, err, args)
	}
}

func TestRunDirectBootReportsAMissingKernel(t *testing.T) {
	var stderr bytes.Buffer
	code := runWith([]string{"--kernel", filepath.Join(t.TempDir(), "missing"), "--initrd", "/dev/null"}, &stderr, backendFactories)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr.String(), "cowork-vmm run:")
}

func TestChooseRunBackend(t *testing.T) {
	none := func() (helper.Backend, error) { return nil, nil }
	t.Setenv("COWORK_VMM_BACKEND", "")
	var note bytes.Buffer
	b, fallback := chooseRunBackend(map[string]helper.BackendFactory{helper.BackendProcess: none}, &note)
	assert.Equal(t, helper.BackendProcess, b)
	assert.False(t, fallback)
	assert.Contains(t, note.String(), "using the process backend")

	note.Reset()
	b, fallback = chooseRunBackend(map[string]helper.BackendFactory{helper.BackendKVM: none, helper.BackendProcess: none}, &note)
	assert.Equal(t, helper.BackendKVM, b)
	assert.True(t, fallback, "kvm preferred, process if it cannot start")
	assert.Empty(t, note.String())

	t.Setenv("COWORK_VMM_BACKEND", "kvm")
	b, fallback = chooseRunBackend(map[string]helper.BackendFactory{helper.BackendKVM: none, helper.BackendProcess: none}, &note)
	assert.Equal(t, "kvm", b)
	assert.False(t, fallback, "an explicit choice is not second-guessed")
	assert.Empty(t, note.String())
}

// TestFallbackHint: the kvm backend (named, or the default) points at the
// process backend only when that one is built in; no other backend gets a
// hint.
func TestFallbackHint(t *testing.T) {
	none := func() (helper.Backend, error) { return nil, nil }
	both := map[string]helper.BackendFactory{helper.BackendKVM: none, helper.BackendProcess: none}
	assert.Equal(t, processFallbackHint, fallbackHint("", both))
	assert.Equal(t, processFallbackHint, fallbackHint(helper.BackendKVM, both))
	assert.Empty(t, fallbackHint(helper.BackendProcess, both))
	assert.Empty(t, fallbackHint(helper.BackendKVM, map[string]helper.BackendFactory{helper.BackendKVM: none}))
}

func TestRunFallsBackWhenKVMCannotStart(t *testing.T) {
	t.Setenv("COWORK_VMM_BACKEND", "")
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	failing := func(msg string) helper.BackendFactory {
		return func() (helper.Backend, error) { return nil, errors.New(msg) }
	}
	var errOut bytes.Buffer
	code := runWith([]string{"--", "true"}, &errOut, func(*slog.Logger, io.Writer) map[string]helper.BackendFactory {
		return map[string]helper.BackendFactory{helper.BackendKVM: failing("no /dev/kvm"), helper.BackendProcess: failing("no user namespaces")}
	})
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut.String(), "cowork-vmm: startVM: the kvm backend is unavailable: no /dev/kvm; using the process backend")
	assert.Contains(t, errOut.String(), "no user namespaces", "the fallback was tried")
}
