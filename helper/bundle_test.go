package helper

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

// TestStartVMSaysTheBundleIsNotBooted: the client's bundlePath is logged
// once (per path) as not booted, with what its rootfs image is.
func TestStartVMSaysTheBundleIsNotBooted(t *testing.T) {
	var logs ratelogtest.LogBuffer
	e := newTestEnvWith(t, func(o *Options) { o.Logger = logs.Logger() })
	bundle := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bundle, "rootfs.img"), make([]byte, 4096), 0o644))
	for range 2 {
		e.mustCall("startVM", map[string]any{"bundlePath": bundle}, nil)
		e.mustCall("stopVM", nil, nil)
	}
	lines := logs.Lines("VM bundle is not booted")
	require.Len(t, lines, 1, "logged once for the same bundle")
	assert.Contains(t, lines[0], bundle)
	assert.Contains(t, lines[0], "rootfs.img, 4096 bytes, not read")
	e.mustCall("startVM", map[string]any{"bundlePath": filepath.Join(bundle, "other")}, nil)
	lines = logs.Lines("VM bundle is not booted")
	require.Len(t, lines, 2, "a new bundle path is logged again")
	assert.Contains(t, lines[1], "no rootfs.img")
}

// bundleBootingBackend is the fake backend as one that boots bundles
// (BundleBooter), its guests booting the image (ImageUserland), as the
// kvm backend's do with a usable bundle.
type bundleBootingBackend struct{ *fakeBackend }

func (bundleBootingBackend) BootsBundles() bool { return true }

func (b bundleBootingBackend) Start(ctx context.Context, cfg GuestConfig) (Guest, error) {
	g, err := b.fakeBackend.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return imageGuest{g.(*fakeGuest)}, nil
}

type imageGuest struct{ *fakeGuest }

func (imageGuest) BootsImage() bool { return true }

// TestStartVMBootsTheBundleImage: a backend that boots bundles gets the
// bundlePath and the profile's directory, the helper says nothing of a
// bundle not booted, and a guest booting the image gets none of the
// host's system directories.
func TestStartVMBootsTheBundleImage(t *testing.T) {
	var logs ratelogtest.LogBuffer
	var fake *fakeBackend
	e := newTestEnvWith(t, func(o *Options) {
		o.Logger = logs.Logger()
		inner := o.Backends["fake"]
		o.Backends["fake"] = func() (Backend, error) {
			b, err := inner()
			fake = b.(*fakeBackend)
			return bundleBootingBackend{fake}, err
		}
	})
	bundle := t.TempDir()
	e.mustCall("startVM", map[string]any{"bundlePath": bundle}, nil)
	waitFor(t, "the guest's setup", func() bool {
		g := fake.last()
		if g == nil {
			return false
		}
		g.agent.mu.Lock()
		defer g.agent.mu.Unlock()
		return g.agent.setup != nil
	})
	g := fake.last()
	assert.Equal(t, bundle, g.cfg.Bundle)
	assert.True(t, strings.HasPrefix(g.cfg.ProfileDir, filepath.Join(e.s.opts.DataDir, ProfilesDir)+"/"), g.cfg.ProfileDir)
	g.agent.mu.Lock()
	assert.Empty(t, g.agent.setup.System, "the image is the userland")
	g.agent.mu.Unlock()
	shared, _ := g.shareState()
	assert.NotContains(t, shared, e.sysDir, "no host system directory is shared")
	assert.Empty(t, logs.Lines("VM bundle is not booted"))
	e.mustCall("stopVM", nil, nil)
}
