package helper

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// defaultGuestEnv is the environment every process starts from; spawn.env
// is merged over it.
func defaultGuestEnv(session string) map[string]string {
	return map[string]string{
		"PATH":  protocol.DefaultPath,
		"HOME":  guestSessionDir(session),
		"LANG":  "C.UTF-8",
		"TERM":  "xterm-256color",
		"SHELL": "/bin/sh",
		"USER":  "cowork",
	}
}

func (s *Service) spawn(_ context.Context, p protocol.ClientSpawnParams) (protocol.SpawnResult, error) {
	res := protocol.SpawnResult{FailedMounts: []string{}}
	if p.ID == "" {
		return res, errors.New("spawn: id is empty")
	}
	if p.Command == "" {
		return res, errors.New("spawn: command is empty")
	}
	if err := validateSessionName(p.Name); err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	cwd := guestSessionDir(p.Name)
	if p.Cwd != "" {
		if !path.IsAbs(p.Cwd) || strings.ContainsRune(p.Cwd, 0) {
			return res, fmt.Errorf("spawn: cwd %q is not an absolute guest path", p.Cwd)
		}
		cwd = path.Clean(p.Cwd)
	}
	env, err := s.spawnEnv(p)
	if err != nil {
		return res, err
	}
	inst, err := s.activeVM()
	if err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	// A process of the session that ends while this one is being set up
	// must not withdraw the mounts it is about to run in.
	defer inst.useSession(p.Name)()
	if err := s.mountSession(inst, p.Name); err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(p.AdditionalMounts)) {
		m := p.AdditionalMounts[name]
		if err := s.mountInSession(inst, p.Name, name, m.Path, m.Mode); err != nil {
			s.log.Warn("mount failed", "session", p.Name, "mount", name, "err", err)
			res.FailedMounts = append(res.FailedMounts, name)
		}
	}

	proc := &process{id: p.ID, session: p.Name, guest: inst, running: true}
	s.mu.Lock()
	if old := s.procs.get(p.ID); old != nil && old.running {
		s.mu.Unlock()
		return res, fmt.Errorf("spawn: a process with id %q is already running", p.ID)
	}
	// Registered before the agent starts it, so its first output is not
	// dropped as belonging to an unknown process, and its first connection
	// finds its policy. p.AllowedDomains goes in as decoded: nil (absent)
	// allows every host, non-nil even when empty is enforced.
	s.procs.add(proc)
	token, policy := s.egressReg.Register(p.ID, p.AllowedDomains)
	s.mu.Unlock()
	if ignored := policy.Ignored(); len(ignored) > 0 {
		s.log.Warn("spawn: allowedDomains entries ignored (not host names or *.suffix wildcards)", "id", p.ID, "entries", ignored)
	}

	err = inst.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: p.ID, Session: p.Name, Command: p.Command, Args: p.Args, Cwd: cwd, Env: env, EgressToken: token}, nil)
	if err != nil {
		s.mu.Lock()
		s.procs.remove(proc)
		s.egressReg.Unregister(p.ID)
		s.mu.Unlock()
		return res, fmt.Errorf("spawn %s: %w", p.Command, err)
	}
	allowed := "all (no allowedDomains)"
	if !policy.AllowsAll() {
		allowed = fmt.Sprintf("%d allowedDomains", len(p.AllowedDomains))
	}
	s.log.Info("spawned", "id", p.ID, "session", p.Name, "command", p.Command, "failedMounts", len(res.FailedMounts), "egress", allowed)
	return res, nil
}

// spawnEnv merges the client's env over the default and adds the OAuth token.
func (s *Service) spawnEnv(p protocol.ClientSpawnParams) ([]string, error) {
	env := defaultGuestEnv(p.Name)
	for k, v := range p.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("spawn: invalid environment variable %q", k)
		}
		env[k] = v
	}
	if _, set := p.Env["CLAUDE_CODE_OAUTH_TOKEN"]; !set {
		token := p.OAuthToken
		if token == "" {
			s.mu.Lock()
			token = s.oauthToken
			s.mu.Unlock()
		}
		if strings.ContainsRune(token, 0) {
			return nil, errors.New("spawn: oauthToken contains a NUL byte")
		}
		if token != "" {
			env["CLAUDE_CODE_OAUTH_TOKEN"] = token
		}
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out, nil
}
