package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFlags(t *testing.T) {
	var errOut bytes.Buffer
	assert.Equal(t, 2, run(t.Context(), []string{"--runs", "0"}, &bytes.Buffer{}, &errOut))
	assert.Contains(t, errOut.String(), "--runs 0")
	errOut.Reset()
	assert.Equal(t, 2, run(t.Context(), []string{"--peers", "firecracker"}, &bytes.Buffer{}, &errOut))
	assert.Contains(t, errOut.String(), `unknown peer "firecracker"`)
	errOut.Reset()
	assert.Equal(t, 2, run(t.Context(), []string{"stray"}, &bytes.Buffer{}, &errOut))
	assert.Contains(t, errOut.String(), `unexpected arguments ["stray"]`)
	errOut.Reset()
	assert.Equal(t, 0, run(t.Context(), []string{"-h"}, &bytes.Buffer{}, &errOut))
	assert.Contains(t, errOut.String(), "Usage: cowork-bench")
	assert.Contains(t, errOut.String(), "-nested-cpus")
	assert.Contains(t, errOut.String(), "-fs-runs")
	errOut.Reset()
	assert.Equal(t, 1, run(t.Context(), []string{"--direct", "--binary", "/nonexistent/cowork-vmm", "--out", t.TempDir()}, &bytes.Buffer{}, &errOut))
	assert.Contains(t, errOut.String(), "not a file")
}
