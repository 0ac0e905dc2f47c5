package egress

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"sync"
)

// Registry holds the policy and token of every live spawn. The helper
// registers a spawn before asking the agent to start it and unregisters it
// when its exit event arrives. Safe for concurrent use.
type Registry struct {
	mu     sync.Mutex
	spawns map[string]registered
}

type registered struct {
	policy Policy
	token  string
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{spawns: map[string]registered{}} }

// Register records spawnID's policy (allowedDomains: nil = absent = allow
// all) and returns a fresh token that the agent must present with each of
// that spawn's egress requests. Registering an id again replaces it.
func (r *Registry) Register(spawnID string, allowedDomains []string) (token string, policy Policy) {
	var raw [16]byte
	rand.Read(raw[:]) // never fails (crypto/rand panics instead of failing)
	token = hex.EncodeToString(raw[:])
	policy = ParsePolicy(allowedDomains)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spawns[spawnID] = registered{policy: policy, token: token}
	return token, policy
}

// Unregister forgets spawnID; its later egress requests are refused.
func (r *Registry) Unregister(spawnID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.spawns, spawnID)
}

// Lookup returns spawnID's policy if the token matches. It is Server.Lookup.
func (r *Registry) Lookup(spawnID, token string) (Policy, bool) {
	r.mu.Lock()
	s, ok := r.spawns[spawnID]
	r.mu.Unlock()
	if !ok || subtle.ConstantTimeCompare([]byte(s.token), []byte(token)) != 1 {
		return Policy{}, false
	}
	return s.policy, true
}
