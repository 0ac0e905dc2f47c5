package helper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/protocol"
	"golang.org/x/sys/unix"
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
	// A oneShot process of the session that just ended is still releasing
	// its mounts: this spawn starts after that.
	if err := inst.waitRelease(ctx, p.Name); err != nil {
		return res, fmt.Errorf("spawn: waiting for the session's earlier mounts to be released: %w", err)
	}
	// A process of the session that ends while this one is being set up
	// must not withdraw the mounts it is about to run in.
	defer inst.useSession(p.Name)()
	failed, err := s.prepareSession(inst, p)
	if err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	res.FailedMounts = failed

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
		inst.oneShots.add(proc)
	}
	if ignored := policy.Ignored(); len(ignored) > 0 {
		s.log.Warn("spawn: allowedDomains entries ignored (not host names or *.suffix wildcards)", "id", p.ID, "entries", ignored)
	}

	err = inst.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: p.ID, Session: p.Name, Command: p.Command, Args: p.Args, Cwd: cwd, Env: env, EgressToken: token, OutputWindow: outputWindow}, nil)
	if err != nil {
		s.mu.Lock()
		s.procs.remove(proc)
		s.egressReg.Unregister(p.ID)
		s.mu.Unlock()
		inst.oneShots.take(proc)
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

// prepareSession mounts a spawn's session as its flags say and returns the
// additionalMounts that failed.
func (s *Service) prepareSession(inst *guestInstance, p protocol.ClientSpawnParams) ([]string, error) {
	if p.MountSkeletonHome {
		dir, err := s.ensureSessionDir(p.Name)
		if err != nil {
			return nil, err
		}
		if err := copySkeleton(skelDir, dir); err != nil {
			s.log.Warn("the session's home skeleton is incomplete", "session", p.Name, "err", err)
		}
	}
	if err := s.mountSession(inst, p.Name); err != nil {
		return nil, err
	}
	failed := []string{}
	own := map[string]bool{guestSessionDir(p.Name): true}
	for _, name := range slices.Sorted(maps.Keys(p.AdditionalMounts)) {
		m := p.AdditionalMounts[name]
		targets, err := s.mountSpawnMount(inst, p.Name, name, m, p.MountSkeletonHome)
		for _, t := range targets {
			own[t] = true
		}
		if err != nil {
			s.log.Warn("mount failed", "session", p.Name, "mount", name, "err", err)
			failed = append(failed, name)
		}
	}
	if p.IsResume {
		inst.restoreSessionMounts(p.Name)
	} else {
		inst.retireSessionMounts(p.Name, own)
	}
	return failed, nil
}

// mountSpawnMount mounts one additionalMounts entry at mnt/<name>, and with
// the skeleton home a configuration entry at <name> in the home too; it
// returns the targets it mounted.
func (s *Service) mountSpawnMount(inst *guestInstance, session, name string, m protocol.AdditionalMount, skeleton bool) ([]string, error) {
	if err := s.mountInSession(inst, session, name, m.Path, m.Mode); err != nil {
		return nil, err
	}
	rel, _ := cleanMountName(name) // mountInSession has checked it
	inMnt := path.Join(guestSessionDir(session), "mnt", rel)
	targets := []string{inMnt}
	if !skeleton || !isConfigMount(rel) {
		return targets, nil
	}
	inst.mountMu.Lock()
	key := inst.mounts.byTarget[inMnt].key
	inst.mountMu.Unlock()
	inHome := path.Join(guestSessionDir(session), rel)
	if err := inst.mount(key.host, inHome, key.readOnly); err != nil {
		return targets, fmt.Errorf("in the home: %w", err)
	}
	return append(targets, inHome), nil
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

// restoreSessionMounts mounts again the session's spawn mounts that were
// withdrawn when its last process ended (a resume), outer first.
func (inst *guestInstance) restoreSessionMounts(session string) {
	inst.mountMu.Lock()
	keys := map[string]mountKey{}
	for _, target := range inst.mounts.inSession(session) {
		if r := inst.mounts.byTarget[target]; r.withdrawn && isSpawnMount(session, target) {
			keys[target] = r.key
		}
	}
	inst.mountMu.Unlock()
	targets := slices.SortedFunc(maps.Keys(keys), func(a, b string) int { return len(a) - len(b) })
	for _, target := range targets {
		if err := inst.mount(keys[target].host, target, keys[target].readOnly); err != nil {
			inst.s.log.Warn("a resumed session's mount could not be made again", "session", session, "target", target, "err", err)
		}
	}
}

// sessionIdle says whether no process of the session runs and no more
// than ownUses calls use it (useSession): another spawn being set up, a
// readFile. The caller holds mountMu (lock order: mountMu, then
// Service.mu).
func (inst *guestInstance) sessionIdle(session string, ownUses int) bool {
	if inst.mounts.users[session] > ownUses {
		return false
	}
	inst.s.mu.Lock()
	defer inst.s.mu.Unlock()
	return !inst.s.procs.sessionBusy(session)
}

// retireSessionMounts takes the session's spawn mounts but those in keep
// out of the guest (unmounted, and withdrawn) for a fresh start, unless the
// session is in use by more than this spawn. Their records stay: readFile
// and a later resume make them again.
func (inst *guestInstance) retireSessionMounts(session string, keep map[string]bool) {
	inst.mountMu.Lock()
	defer inst.mountMu.Unlock()
	if !inst.sessionIdle(session, 1) { // this spawn uses the session
		return
	}
	for _, target := range inst.sessionTargets(session, func(t string) bool { return !keep[t] && isSpawnMount(session, t) }) {
		r := inst.mounts.byTarget[target]
		inst.unmountInGuest(session, target)
		if !r.withdrawn {
			inst.guest.Unshare(r.src)
		}
		inst.mounts.byTarget[target] = mountRecord{key: r.key, withdrawn: true}
	}
}

// releaseSession unmounts, withdraws and forgets every mount of an idle
// session, its home's too (a oneShot process's end): the next spawn mounts
// afresh, readFile reads the home from the host.
func (inst *guestInstance) releaseSession(session string) {
	inst.mountMu.Lock()
	defer inst.mountMu.Unlock()
	if !inst.sessionIdle(session, 0) {
		return
	}
	for _, target := range inst.sessionTargets(session, func(string) bool { return true }) {
		r := inst.mounts.byTarget[target]
		inst.unmountInGuest(session, target)
		if !r.withdrawn {
			inst.guest.Unshare(r.src)
		}
		delete(inst.mounts.byTarget, target)
	}
}

// sessionTargets lists the session's mount targets that pick keeps, inner
// first. The caller holds mountMu.
func (inst *guestInstance) sessionTargets(session string, pick func(string) bool) []string {
	var targets []string
	for _, target := range inst.mounts.inSession(session) {
		if pick(target) {
			targets = append(targets, target)
		}
	}
	slices.SortFunc(targets, func(a, b string) int { return len(b) - len(a) })
	return targets
}

// unmountInGuest has the agent unmount target (a failure is logged: the
// mount is withdrawn on the host side anyway).
func (inst *guestInstance) unmountInGuest(session, target string) {
	if err := inst.call(protocol.AgentMethodUnmount, protocol.UnmountParams{Target: target}, nil); err != nil {
		inst.s.log.Warn("unmounting a session's mount in the guest", "session", session, "target", target, "err", err)
	}
}

// oneShotState tracks a guest's running oneShot processes (a process has
// no field for it) and the releases their ends started.
type oneShotState struct {
	mu sync.Mutex
	// procs are the running oneShot processes.
	procs map[*process]bool
	// releasing holds, per session, a channel closed when the release a
	// oneShot process's end started is done: a spawn of that session
	// waits for it, so a client that spawns again on seeing the exit
	// never finds the released mounts still there.
	releasing map[string]chan struct{}
}

func (o *oneShotState) add(p *process) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.procs == nil {
		o.procs = make(map[*process]bool)
	}
	o.procs[p] = true
}

// take forgets p and says whether it was a oneShot process.
func (o *oneShotState) take(p *process) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	was := o.procs[p]
	delete(o.procs, p)
	return was
}

// spawnExited releases what an exited process held beyond its exit: for a
// oneShot process, its session's mounts (when it was the session's last).
// Called on the agent's read loop before the exit is published: the
// release itself runs in the background (it calls the agent), and later
// spawns of the session wait for it (waitRelease).
func (inst *guestInstance) spawnExited(p *process) {
	if !inst.oneShots.take(p) {
		return
	}
	done := make(chan struct{})
	inst.oneShots.mu.Lock()
	if inst.oneShots.releasing == nil {
		inst.oneShots.releasing = make(map[string]chan struct{})
	}
	inst.oneShots.releasing[p.session] = done
	inst.oneShots.mu.Unlock()
	go func() {
		defer close(done)
		inst.releaseSession(p.session)
		inst.oneShots.mu.Lock()
		if inst.oneShots.releasing[p.session] == done {
			delete(inst.oneShots.releasing, p.session)
		}
		inst.oneShots.mu.Unlock()
	}()
}

// waitRelease waits until no release of session is in progress, or ctx
// ends.
func (inst *guestInstance) waitRelease(ctx context.Context, session string) error {
	inst.oneShots.mu.Lock()
	done := inst.oneShots.releasing[session]
	inst.oneShots.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-inst.ended:
		return errors.New("the VM ended")
	}
}

// skelDir is the host's home skeleton (mountSkeletonHome).
var skelDir = "/etc/skel"

// Bounds of a home skeleton's copy.
const (
	maxSkelEntries   = 256
	maxSkelFileBytes = 1 << 20
	maxSkelDepth     = 8
)

// copySkeleton copies the regular files and directories of skel into the
// session directory home, keeping what home has (never overwriting,
// never following a symlink: the session is guest-writable), modes without
// set-id bits, at most maxSkelEntries entries of at most maxSkelFileBytes.
func copySkeleton(skel, home string) error {
	src, err := unix.Open(skel, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening %s: %w", skel, err)
	}
	dst, err := unix.Open(home, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(src)
		return fmt.Errorf("opening the session directory: %w", err)
	}
	left := maxSkelEntries
	return copySkelDir(src, dst, 0, &left)
}

// copySkelDir copies the entries of the directory src into dst and closes
// both.
func copySkelDir(src, dst, depth int, left *int) error {
	dir := os.NewFile(uintptr(src), "skel")
	defer dir.Close()
	defer unix.Close(dst)
	names, err := dir.Readdirnames(maxSkelEntries)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	var errs []error
	for _, name := range names {
		if *left--; *left < 0 {
			return errors.New("more than the entries a skeleton may have")
		}
		var st unix.Stat_t
		if err := unix.Fstatat(src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			errs = append(errs, err)
			continue
		}
		perm := uint32(st.Mode & 0o777)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			errs = append(errs, copySkelFile(src, dst, name, perm))
		case unix.S_IFDIR:
			if depth < maxSkelDepth {
				errs = append(errs, copySkelSubdir(src, dst, name, perm, depth, left))
			}
		}
	}
	return errors.Join(errs...)
}

// copySkelSubdir copies the directory name of src into dst, into what dst
// has at name if that is a directory.
func copySkelSubdir(src, dst int, name string, perm uint32, depth int, left *int) error {
	if err := unix.Mkdirat(dst, name, perm); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s: %w", name, err)
	}
	sub, err := unix.Openat(src, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	subDst, err := unix.Openat(dst, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(sub)
		return nil // not a directory in the home (a file, a symlink): left as it is
	}
	return copySkelDir(sub, subDst, depth+1, left)
}

// copySkelFile copies the regular file name of src to dst unless dst has
// that name.
func copySkelFile(src, dst int, name string, perm uint32) error {
	in, err := unix.Openat(src, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	inFile := os.NewFile(uintptr(in), name)
	defer inFile.Close()
	out, err := unix.Openat(dst, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if errors.Is(err, unix.EEXIST) {
		return nil // the home's own
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	outFile := os.NewFile(uintptr(out), name)
	_, err = io.Copy(outFile, io.LimitReader(inFile, maxSkelFileBytes))
	if cerr := outFile.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
