package helper

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/internal/beneath"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// GuestSessionsDir is where sessions appear in the guest.
const GuestSessionsDir = "/sessions"

// defaultGuestEnv is the environment every process starts from; spawn.env
// is merged over it.
func defaultGuestEnv(session string) map[string]string {
	return map[string]string{
		"PATH":  "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":  guestSessionDir(session),
		"LANG":  "C.UTF-8",
		"TERM":  "xterm-256color",
		"SHELL": "/bin/sh",
		"USER":  "cowork",
	}
}

// signalNumbers lists the signal names kill accepts.
var signalNumbers = map[string]int{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12,
	"SIGPIPE": 13, "SIGALRM": 14, "SIGTERM": 15, "SIGCHLD": 17, "SIGCONT": 18,
	"SIGSTOP": 19, "SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22, "SIGWINCH": 28,
}

// SignalNumber returns the Linux number of a signal name kill accepts.
func SignalNumber(name string) (int, bool) {
	n, ok := signalNumbers[name]
	return n, ok
}

func guestSessionDir(name string) string { return path.Join(GuestSessionsDir, name) }

// validateSessionName refuses names that could leave the sessions directory.
func validateSessionName(name string) error {
	switch {
	case name == "":
		return errors.New("session name is empty")
	case len(name) > 255:
		return errors.New("session name is longer than 255 bytes")
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("session name %q contains '/' or a NUL byte", name)
	case strings.Contains(name, ".."), name == ".":
		return fmt.Errorf("session name %q contains '..' or is '.'", name)
	}
	return nil
}

// cleanMountName turns a mountName (which may contain '/') into a relative
// path below the session's mnt directory, refusing '..' components.
func cleanMountName(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("mount name %q is empty or contains a NUL byte", name)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("mount name %q is absolute", name)
	}
	if slices.Contains(strings.Split(name, "/"), "..") {
		return "", fmt.Errorf("mount name %q contains a '..' component", name)
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", fmt.Errorf("mount name %q names no directory", name)
	}
	return clean, nil
}

// hostPathFromClient turns a path "relative to /" as the client sends it
// into an absolute host path.
func hostPathFromClient(p string) (string, error) {
	if strings.TrimLeft(p, "/") == "" || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("host path %q is empty or contains a NUL byte", p)
	}
	return filepath.Clean("/" + p), nil
}

// mountMode parses a mode: "" and "rw" and "rwd" are writable, "ro" is not.
func mountMode(mode string) (readOnly bool, err error) {
	switch mode {
	case "", "rw", "rwd":
		return false, nil
	case "ro":
		return true, nil
	}
	return false, fmt.Errorf("unknown mount mode %q (want rw, ro or rwd)", mode)
}

// ensureSessionDir creates the host directory of a session. The session
// directory is guest-writable, so it works beneath the sessions directory
// by descriptor: what stands at the name must be a real directory, not a
// symlink.
func (s *Service) ensureSessionDir(name string) (string, error) {
	root, err := s.openSessions()
	if err != nil {
		return "", err
	}
	defer root.Close()
	if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating the session directory: %w", err)
	}
	dir, err := root.OpenDir(name)
	if err != nil {
		return "", fmt.Errorf("session %s is not a directory: %w", name, err)
	}
	dir.Close()
	return filepath.Join(s.sessionsDir, name), nil
}

// mountRecord is what mount put at a guest target: what was asked for
// (key) and the source the guest got for it (src), which is withdrawn
// (Guest.Unshare) when the target is mounted anew, when its session is
// deleted, and when its session's last process ends. A withdrawn record
// stays (withdrawn set, src zero) so that readFile can mount it again.
type mountRecord struct {
	key       mountKey
	src       protocol.MountSource
	withdrawn bool
}

// mountTable is a guest's mount bookkeeping, guarded by
// vmInstance.mountMu; its zero value is ready to use.
type mountTable struct {
	byTarget map[string]mountRecord
	// users counts, per session, the calls that use its mounts while no
	// process of theirs runs yet (a spawn until its process is registered,
	// a readFile): withdrawIfIdle leaves the session alone meanwhile.
	users map[string]int
}

func (t *mountTable) set(target string, r mountRecord) {
	if t.byTarget == nil {
		t.byTarget = make(map[string]mountRecord)
	}
	t.byTarget[target] = r
}

// inSession lists the targets of a session's mounts: its home and what
// lies below it.
func (t *mountTable) inSession(name string) []string {
	prefix := guestSessionDir(name)
	var targets []string
	for target := range t.byTarget {
		if target == prefix || strings.HasPrefix(target, prefix+"/") {
			targets = append(targets, target)
		}
	}
	return targets
}

// mount makes a host path visible at a guest target, unless the same thing
// is mounted there already (spawns of one session repeat their mounts). A
// single file is shared as itself (Guest.Share), never as its directory.
// What was mounted at target before is withdrawn once the agent has
// replaced it — and also if the agent failed to (it unmounts the old
// mount first): a target remounted read-only must not stay writable.
func (vm *vmInstance) mount(host, target string, readOnly bool) error {
	fi, err := os.Stat(host)
	if err != nil {
		return fmt.Errorf("mount source: %w", err)
	}
	key := mountKey{host: host, readOnly: readOnly}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("mount source %s is neither a directory nor a regular file", host)
		}
		key.file = filepath.Base(host)
	}
	vm.mountMu.Lock()
	defer vm.mountMu.Unlock()
	old, had := vm.mounts.byTarget[target]
	if had && old.key == key && !old.withdrawn {
		return nil
	}
	src, err := vm.guest.Share(host, readOnly)
	if err != nil {
		return fmt.Errorf("sharing %s with the guest: %w", host, err)
	}
	m := protocol.Mount{Source: src, Target: target, ReadOnly: readOnly, SourceFile: key.file}
	err = vm.call(protocol.AgentMethodMount, protocol.MountParams{Mount: m}, nil)
	if had {
		if !old.withdrawn {
			vm.guest.Unshare(old.src)
		}
		delete(vm.mounts.byTarget, target)
	}
	if err != nil {
		vm.guest.Unshare(src)
		return err
	}
	vm.mounts.set(target, mountRecord{key: key, src: src})
	return nil
}

// forgetSessionMounts withdraws a session's mounts and drops their records
// (its host directory was deleted; the next spawn mounts it afresh).
func (vm *vmInstance) forgetSessionMounts(name string) {
	vm.mountMu.Lock()
	defer vm.mountMu.Unlock()
	for _, target := range vm.mounts.inSession(name) {
		if r := vm.mounts.byTarget[target]; !r.withdrawn {
			vm.guest.Unshare(r.src)
		}
		delete(vm.mounts.byTarget, target)
	}
}

// useSession marks a session's mounts in use by a call that has no running
// process of the session to show for it yet (spawn, readFile); the
// returned func ends the use and withdraws the mounts if the session is
// then idle.
func (vm *vmInstance) useSession(name string) (done func()) {
	vm.mountMu.Lock()
	if vm.mounts.users == nil {
		vm.mounts.users = make(map[string]int)
	}
	vm.mounts.users[name]++
	vm.mountMu.Unlock()
	return func() {
		vm.mountMu.Lock()
		if vm.mounts.users[name]--; vm.mounts.users[name] <= 0 {
			delete(vm.mounts.users, name)
		}
		vm.mountMu.Unlock()
		vm.withdrawIfIdle(name)
	}
}

// withdrawIfIdle withdraws a session's mounts when none of its processes
// runs and no call uses them (its last process ended, or a spawn failed):
// the guest keeps no way into the session's files; the records stay, and
// the next spawn (or readFile) mounts them afresh. Lock order: mountMu,
// then Service.mu.
func (vm *vmInstance) withdrawIfIdle(name string) {
	vm.mountMu.Lock()
	defer vm.mountMu.Unlock()
	if vm.mounts.users[name] > 0 {
		return
	}
	vm.s.mu.Lock()
	busy := vm.s.procs.sessionBusy(name)
	vm.s.mu.Unlock()
	if busy {
		return
	}
	for _, target := range vm.mounts.inSession(name) {
		r := vm.mounts.byTarget[target]
		if r.withdrawn {
			continue
		}
		vm.guest.Unshare(r.src)
		vm.mounts.byTarget[target] = mountRecord{key: r.key, withdrawn: true}
	}
}

// remountForRead mounts again, for readFile, the withdrawn mounts of a
// session that lead to guestPath (its home, then a mount below it), so
// that a read after the session's last process ended sees what it saw
// before. The caller holds a useSession of the session.
func (vm *vmInstance) remountForRead(session, guestPath string) error {
	vm.mountMu.Lock()
	var again []string
	for _, target := range vm.mounts.inSession(session) {
		if vm.mounts.byTarget[target].withdrawn && (guestPath == target || strings.HasPrefix(guestPath, target+"/")) {
			again = append(again, target)
		}
	}
	keys := make(map[string]mountKey, len(again))
	for _, target := range again {
		keys[target] = vm.mounts.byTarget[target].key
	}
	vm.mountMu.Unlock()
	slices.SortFunc(again, func(a, b string) int { return len(a) - len(b) }) // outer first
	for _, target := range again {
		if err := vm.mount(keys[target].host, target, keys[target].readOnly); err != nil {
			return fmt.Errorf("mounting %s again: %w", target, err)
		}
	}
	return nil
}

// mountSession mounts a session's home directory.
func (s *Service) mountSession(vm *vmInstance, name string) error {
	dir, err := s.ensureSessionDir(name)
	if err != nil {
		return err
	}
	if err := vm.mount(dir, guestSessionDir(name), false); err != nil {
		return fmt.Errorf("mounting session %s: %w", name, err)
	}
	return nil
}

// mountInSession mounts a host path (relative to /, as the client sends it)
// at /sessions/<name>/mnt/<mountName>.
func (s *Service) mountInSession(vm *vmInstance, session, mountName, hostRel, mode string) error {
	rel, err := cleanMountName(mountName)
	if err != nil {
		return err
	}
	host, err := hostPathFromClient(hostRel)
	if err != nil {
		return err
	}
	readOnly, err := mountMode(mode)
	if err != nil {
		return err
	}
	if _, err := os.Stat(host); errors.Is(err, os.ErrNotExist) {
		if readOnly {
			return fmt.Errorf("read-only mount source %s does not exist", host)
		}
		if err := os.MkdirAll(host, 0o755); err != nil {
			return fmt.Errorf("creating mount source: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("mount source: %w", err)
	}
	return vm.mount(host, path.Join(guestSessionDir(session), "mnt", rel), readOnly)
}

func (s *Service) spawn(_ context.Context, p spawnParams) (spawnResult, error) {
	res := spawnResult{FailedMounts: []string{}}
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
	vm, err := s.activeVM()
	if err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	// A process of the session that ends while this one is being set up
	// must not withdraw the mounts it is about to run in.
	defer vm.useSession(p.Name)()
	if err := s.mountSession(vm, p.Name); err != nil {
		return res, fmt.Errorf("spawn: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(p.AdditionalMounts)) {
		m := p.AdditionalMounts[name]
		if err := s.mountInSession(vm, p.Name, name, m.Path, m.Mode); err != nil {
			s.log.Warn("mount failed", "session", p.Name, "mount", name, "err", err)
			res.FailedMounts = append(res.FailedMounts, name)
		}
	}

	proc := &process{id: p.ID, session: p.Name, vm: vm, running: true}
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

	err = vm.call(protocol.AgentMethodSpawn, protocol.SpawnParams{ID: p.ID, Command: p.Command, Args: p.Args, Cwd: cwd, Env: env, EgressToken: token}, nil)
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
func (s *Service) spawnEnv(p spawnParams) ([]string, error) {
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

// runningProcess returns a running process and its guest.
func (s *Service) runningProcess(id string) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs.get(id)
	if p == nil {
		return nil, fmt.Errorf("no process with id %q", id)
	}
	if !p.running {
		return nil, fmt.Errorf("process %q has already exited", id)
	}
	return p, nil
}

func (s *Service) kill(_ context.Context, p killParams) (empty, error) {
	sig := p.Signal
	if sig == "" {
		sig = "SIGTERM"
	}
	if !strings.HasPrefix(sig, "SIG") {
		sig = "SIG" + sig
	}
	if _, ok := signalNumbers[sig]; !ok {
		return nil, fmt.Errorf("kill: unknown signal %q", p.Signal)
	}
	s.mu.Lock()
	proc := s.procs.get(p.ID)
	s.mu.Unlock()
	if proc == nil {
		return nil, fmt.Errorf("kill: no process with id %q", p.ID)
	}
	s.mu.Lock()
	running := proc.running
	s.mu.Unlock()
	if !running {
		return nil, nil // already gone: the exit event has been sent
	}
	if err := proc.vm.call(protocol.AgentMethodKill, protocol.KillParams{ID: p.ID, Signal: sig}, nil); err != nil {
		return nil, fmt.Errorf("kill: %w", err)
	}
	s.log.Info("signalled", "id", p.ID, "signal", sig)
	return nil, nil
}

func (s *Service) writeStdin(_ context.Context, p writeStdinParams) (empty, error) {
	proc, err := s.runningProcess(p.ID)
	if err != nil {
		return nil, fmt.Errorf("writeStdin: %w", err)
	}
	if err := proc.vm.call(protocol.AgentMethodStdin, protocol.StdinParams{ID: p.ID, Data: p.Data}, nil); err != nil {
		return nil, fmt.Errorf("writeStdin: %w", err)
	}
	return nil, nil
}

func (s *Service) isProcessRunning(_ context.Context, p idParams) (processRunningResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	proc := s.procs.get(p.ID)
	if proc == nil {
		return processRunningResult{}, nil
	}
	if proc.running {
		return processRunningResult{Running: true}, nil
	}
	res := processRunningResult{}
	if proc.exitCode != nil {
		res.ExitCode = ptr(*proc.exitCode)
	} else if n, ok := signalNumbers[proc.signal]; ok {
		res.ExitCode = ptr(128 + n) // as a shell reports a signal death
	}
	return res, nil
}

func (s *Service) mountPath(_ context.Context, p mountPathParams) (empty, error) {
	s.mu.Lock()
	proc := s.procs.get(p.ProcessID)
	s.mu.Unlock()
	if proc == nil {
		return nil, fmt.Errorf("mountPath: no process with id %q", p.ProcessID)
	}
	vm, err := s.activeVM()
	if err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	if err := s.mountSession(vm, proc.session); err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	if err := s.mountInSession(vm, proc.session, p.MountName, p.Subpath, p.Mode); err != nil {
		return nil, fmt.Errorf("mountPath: %w", err)
	}
	s.log.Info("mounted", "session", proc.session, "mount", p.MountName)
	return nil, nil
}

func (s *Service) readFile(_ context.Context, p readFileParams) (readFileResult, error) {
	session := p.ProcessName
	s.mu.Lock()
	if proc := s.procs.get(session); proc != nil && !s.sessionExists(session) {
		session = proc.session // a process id where a session name belongs
	}
	s.mu.Unlock()
	if err := validateSessionName(session); err != nil {
		return readFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	clean, err := confineToSession(session, p.FilePath)
	if err != nil {
		return readFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	vm, err := s.activeVM()
	if err != nil {
		return readFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	defer vm.useSession(session)()
	if err := vm.remountForRead(session, clean); err != nil {
		return readFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	var r protocol.ReadFileResult
	if err := vm.call(protocol.AgentMethodReadFile, protocol.ReadFileParams{Path: clean}, &r); err != nil {
		return readFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	return readFileResult{Content: base64.StdEncoding.EncodeToString(r.Content)}, nil
}

// sessionExists says whether a session directory (not a symlink) exists on
// the host.
func (s *Service) sessionExists(name string) bool {
	if validateSessionName(name) != nil {
		return false
	}
	root, err := beneath.Open(s.sessionsDir)
	if err != nil {
		return false
	}
	defer root.Close()
	e, err := root.Stat(name)
	return err == nil && e.IsDir()
}

// confineToSession cleans a guest path (a relative one is taken relative to
// the session's home) and checks that it lies strictly inside the session's
// home, /sessions/<name>.
func confineToSession(name, guestPath string) (string, error) {
	if guestPath == "" || strings.ContainsRune(guestPath, 0) {
		return "", fmt.Errorf("%q is not a guest path", guestPath)
	}
	home := guestSessionDir(name)
	if !path.IsAbs(guestPath) {
		guestPath = home + "/" + guestPath
	}
	clean := path.Clean(guestPath)
	if !strings.HasPrefix(clean, home+"/") {
		return "", fmt.Errorf("%s is outside session %s (%s)", guestPath, name, home)
	}
	return clean, nil
}

// AddGuestMount mounts a host path at any absolute guest path in the
// running guest (the run subcommand's --mount; the client cannot do this).
func (s *Service) AddGuestMount(hostPath, guestPath string, readOnly bool) error {
	if !path.IsAbs(guestPath) {
		return fmt.Errorf("guest path %q is not absolute", guestPath)
	}
	host, err := filepath.Abs(hostPath)
	if err != nil {
		return err
	}
	vm, err := s.activeVM()
	if err != nil {
		return err
	}
	return vm.mount(host, path.Clean(guestPath), readOnly)
}
