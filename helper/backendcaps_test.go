package helper

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// namedBackend is a fakeBackend under another name; it adds no optional
// interface, so the helper must treat it as it treats any backend.
type namedBackend struct {
	*fakeBackend
	name string
}

func (b namedBackend) Name() string { return b.name }

// diskBackend is a backend whose guests attach the root disk
// (RootDiskAttacher), whatever its name.
type diskBackend struct{ namedBackend }

func (diskBackend) AttachesRootDisk() bool { return true }

// TestSetupIgnoresTheBackendName: the setup the agent gets depends on what
// the guest implements (SetupAdjuster), never on the backend's name: a
// guest that adjusts nothing gets a new root, whatever its backend is
// called.
func TestSetupIgnoresTheBackendName(t *testing.T) {
	for _, name := range []string{BackendProcess, BackendKVM, "fake"} {
		fake := &fakeBackend{t: t}
		e := newTestEnvWith(t, func(o *Options) {
			o.Backend = name
			o.Backends = map[string]BackendFactory{name: func() (Backend, error) { return namedBackend{fake, name}, nil }}
		})
		e.mustCall("startVM", nil, nil)
		g := fake.last()
		waitFor(t, "setup sent", func() bool {
			g.agent.mu.Lock()
			defer g.agent.mu.Unlock()
			return g.agent.setup != nil
		})
		g.agent.mu.Lock()
		newRoot := g.agent.setup.NewRoot
		g.agent.mu.Unlock()
		assert.True(t, newRoot, "backend %q: a guest without SetupAdjuster builds a new root", name)
	}
}

// TestRootDiskIgnoresTheBackendName: the helper prepares a root disk for a
// backend that attaches one (RootDiskAttacher), whatever it is called, and
// for no other.
func TestRootDiskIgnoresTheBackendName(t *testing.T) {
	t.Setenv(RootDiskEnv, "")
	s := &Service{opts: Options{DataDir: t.TempDir()}, key: profileKey{name: "p"}, log: slog.New(slog.DiscardHandler), diskQuota: minRootDiskBytes}
	assert.Empty(t, s.rootDiskFor(namedBackend{name: BackendKVM}), "a backend that attaches no disk gets none")
	assert.Equal(t, s.rootDiskPath(), s.rootDiskFor(diskBackend{namedBackend{name: BackendProcess}}))
}

// TestFallbackHintComesFromOptions: a failed start ends with
// Options.FallbackHint, which the binary sets; the helper adds no hint of
// its own for a backend because of its name.
func TestFallbackHintComesFromOptions(t *testing.T) {
	failing := func() (Backend, error) { return failingBackend{errors.New("no KVM device")}, nil }
	for _, hint := range []string{"", "; try the other one"} {
		s, err := New(Options{DataDir: t.TempDir(), Backend: BackendKVM, FallbackHint: hint,
			Backends: map[string]BackendFactory{BackendKVM: failing, BackendProcess: failing}})
		require.NoError(t, err)
		_, err = s.Call(context.Background(), protocol.MethodStartVM, nil)
		require.Error(t, err)
		assert.Equal(t, "starting the guest (kvm backend): no KVM device"+hint, err.Error())
	}
}
