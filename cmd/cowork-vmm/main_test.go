package main

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/helper"
)

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	assert.Equal(t, 0, dispatch([]string{"version"}, &out, io.Discard))
	assert.Contains(t, out.String(), "cowork-vmm dev (commit unknown, go1.")
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

func TestChooseRunBackend(t *testing.T) {
	t.Setenv("COWORK_VMM_BACKEND", "")
	var note bytes.Buffer
	assert.Equal(t, helper.BackendProcess, chooseRunBackend(map[string]helper.BackendFactory{}, &note))
	assert.Contains(t, note.String(), "using the process backend")
	t.Setenv("COWORK_VMM_BACKEND", "kvm")
	note.Reset()
	assert.Equal(t, "kvm", chooseRunBackend(map[string]helper.BackendFactory{}, &note))
	assert.Empty(t, note.String())
}
