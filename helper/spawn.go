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
		// npm's global installs (prefix /usr/local, or /usr for a
		// node packaged as NodeSource's is) are not on node's own
		// search path; the bundle's toolbox (docx, pptxgenjs, …) is
		// meant to be required from a session's scripts.
		"NODE_PATH": "/usr/local/lib/node_modules:/usr/lib/node_modules",
	}
}

func (s *Service) spawn(ctx context.Context, p protocol.ClientSpawnParams) (protocol.SpawnResult, error) {
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
	asked, err := s.mountsAsked(p)
	if err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	uid, err := inst.uids.of(p.Name)
	if err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	inst.releaseMemory() // a session at work gets its memory back at once
	// The lease keeps a process of the session that ends while this one
	// is being set up from withdrawing the mounts it is about to run in.
	lease, err := inst.mounts.prepare(ctx, asked)
	if err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	defer lease.done()
	res.FailedMounts = lease.failed

	proc := &process{id: p.ID, session: p.Name, guest: inst, running: true}
	s.mu.Lock()
	if old := s.procs.get(p.ID); old != nil && old.running {
		s.mu.Unlock()
		return res, fmt.Errorf("spawn: a process with id %q is already running", p.ID)
	}
	if n := s.procs.running(); n >= maxRunningProcesses {
		s.mu.Unlock()
		return res, fmt.Errorf("spawn: %d processes are running already, the most a profile may run", n)
	}
	// Registered before the agent starts it, so its first output is not
	// dropped as belonging to an unknown process, and its first connection
	// finds its policy. p.AllowedDomains goes in as decoded: nil (absent)
	// allows every host, non-nil even when empty is enforced.
	s.procs.add(proc)
	token, policy := s.egressReg.Register(p.ID, p.AllowedDomains)
	s.mu.Unlock()
	if p.OneShot {
		inst.mounts.addOneShot(proc)
	}
	if ignored := policy.Ignored(); len(ignored) > 0 {
		s.log.Warn("spawn: allowedDomains entries ignored (not host names or *.suffix wildcards)", "id", p.ID, "entries", ignored)
	}

	err = inst.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: p.ID, Session: p.Name, UID: uid, Command: p.Command, Args: p.Args, Cwd: cwd, Env: env, EgressToken: token, OutputWindow: outputWindow}, nil)
	if err != nil {
		s.mu.Lock()
		s.procs.remove(proc)
		s.egressReg.Unregister(p.ID)
		s.mu.Unlock()
		inst.mounts.takeOneShot(proc)
		return res, fmt.Errorf("spawn %s: %w", p.Command, err)
	}
	allowed := "all (no allowedDomains)"
	if !policy.AllowsAll() {
		allowed = fmt.Sprintf("%d allowedDomains", len(p.AllowedDomains))
	}
	s.log.Info("spawned", "id", p.ID, "session", p.Name, "command", p.Command, "failedMounts", len(res.FailedMounts), "egress", allowed,
		"isResume", p.IsResume, "oneShot", p.OneShot, "mountSkeletonHome", p.MountSkeletonHome)
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

// The spawn flags (docs/PROTOCOL.md "Guest requests and spawn flags").
//
// A session's home persists across spawns until deleteSessionDirs: no flag
// deletes anything in it. What the flags decide is the rest of the
// session's state in the running guest — the mounts its earlier spawns
// (additionalMounts, the skeleton's config mounts) and mountPath made:
//   - isResume: the session goes on as it was: those mounts are all there
//     again, also the ones withdrawn when its last process ended (a resumed
//     conversation finds the folders it had), besides this spawn's own.
//   - no isResume (a fresh start): only this spawn's mounts are there; the
//     others are unmounted (and withdrawn) — unless another process of the
//     session still runs in them, which is left alone. They are not
//     forgotten: readFile still reads through them, a later resume brings
//     them back.
//   - oneShot: when the process ends and no other of its session runs, the
//     session's mounts, the home's too, are unmounted, withdrawn and
//     forgotten at once (otherwise they are only withdrawn, kept for a
//     later readFile or resume).
//   - mountSkeletonHome: the home gets /etc/skel's files where it lacks
//     them, and each additionalMounts entry whose name starts with a dot
//     (a configuration file or directory: .claude/skills, .gitconfig) is
//     also mounted at that name in the home, read-only when its mode is ro.

// mountsAsked does the host side of what a spawn asks of its session's
// mounts (its flags): the home's directory, its skeleton, each
// additionalMounts entry's source; the guest side is sessionMounts.prepare.
func (s *Service) mountsAsked(p protocol.ClientSpawnParams) (spawnMounts, error) {
	home, err := s.ensureSessionDir(p.Name)
	if err != nil {
		return spawnMounts{}, err
	}
	if p.MountSkeletonHome {
		if err := copySkeleton(skelDir, home); err != nil {
			s.log.Warn("the session's home skeleton is incomplete", "session", p.Name, "err", err)
		}
	}
	asked := spawnMounts{session: p.Name, home: home, resume: p.IsResume}
	for _, name := range slices.Sorted(maps.Keys(p.AdditionalMounts)) {
		m := spawnMount{name: name}
		var inMnt, rel string
		inMnt, rel, m.err = sessionMountTarget(p.Name, name)
		if m.err == nil {
			m.host, m.readOnly, m.err = mountSource(p.AdditionalMounts[name].Path, p.AdditionalMounts[name].Mode)
		}
		m.targets = []string{inMnt}
		if p.MountSkeletonHome && isConfigMount(rel) {
			m.targets = append(m.targets, path.Join(guestSessionDir(p.Name), rel))
		}
		asked.entries = append(asked.entries, m)
	}
	return asked, nil
}

// isConfigMount says whether a mount name (clean, relative) names a
// configuration file or directory of a home: its first component starts
// with a dot.
func isConfigMount(rel string) bool {
	first, _, _ := strings.Cut(rel, "/")
	return strings.HasPrefix(first, ".") && first != "." && first != ".."
}

// isSpawnMount says whether target is one a spawn or mountPath makes in a
// session: below its mnt, or a configuration entry of its home — not the
// home itself, nor what else (the run subcommand's --mount) lies below it.
func isSpawnMount(session, target string) bool {
	rest, ok := strings.CutPrefix(target, guestSessionDir(session)+"/")
	if !ok {
		return false
	}
	return strings.HasPrefix(rest, "mnt/") || isConfigMount(rest)
}
