package agent

// Spawn cgroups (Options.CgroupRoot: the VM).
//
// Each spawn runs in a cgroup v2 of its own, so that its exit can say how
// many of its processes the kernel's OOM killer ended (memory.events'
// oom_kill: the exit event's oomKillCount). The layout, below the cgroup2
// mount (/sys/fs/cgroup in the VM):
//
//	<root>/cgroup.subtree_control    +memory (the agent, PID 1, stays in <root>)
//	<root>/cowork/                   every spawn's parent: memory.max is the
//	                                 guest's memory less a reserve for the
//	                                 agent and the kernel (spawnMemoryMax), so
//	                                 spawns that exhaust it meet the OOM killer
//	                                 in their own cgroups, not in the agent
//	<root>/cowork/<n>/               the n-th spawn's cgroup; it is forked
//	                                 straight into it (CLONE_INTO_CGROUP), so
//	                                 every process it starts is counted
//
// memory.events is hierarchical: an OOM kill of any process of a spawn, by
// its parent's limit or the guest-wide OOM killer, counts in its cgroup.
// After the exit the cgroup is removed; one still holding processes
// (background children left running) is removed once they are gone.
//
// Spawned processes cannot move themselves out: the cgroup files are root's
// in the initial user namespace, and an isolated spawn's /sys is read-only.
//
// Without cgroup v2 and its memory controller (the process backend, whose
// sandbox has no delegated cgroup; a host on cgroup v1) spawns get no
// cgroup and exits no oomKillCount.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

const (
	// spawnCgroupParent is the spawns' parent cgroup below the root.
	spawnCgroupParent = "cowork"
	// maxLingeringCgroups bounds the exited spawns' cgroups kept for a
	// later removal.
	maxLingeringCgroups = 1024
)

// cgroups hands out spawn cgroups; the zero value (and nil) gives none.
type cgroups struct {
	log *slog.Logger
	// ready, when not nil, is closed once parent is set: the parent is
	// prepared in the background (newCgroups).
	ready  chan struct{}
	parent string // <root>/cowork; "" when unavailable
	next   atomic.Uint64

	mu        sync.Mutex
	lingering []string // exited spawns' cgroups that still held processes
}

// newCgroups starts preparing the spawns' parent cgroup below root (a
// cgroup2 mount) in the background — enabling the memory controller takes
// the guest tens of milliseconds, which the agent spends dialing and
// setting up meanwhile; the first spawn waits for it. Without cgroup v2
// and the memory controller there, it logs why and gives no cgroups.
func newCgroups(log *slog.Logger, root string) *cgroups {
	c := &cgroups{log: log}
	if root == "" {
		return c
	}
	c.ready = make(chan struct{})
	go func() {
		defer close(c.ready)
		parent, err := setupCgroupParent(root, readMemTotal())
		if err != nil {
			log.Warn("spawns get no cgroup of their own; exits carry no oomKillCount", "err", err)
			return
		}
		c.parent = parent
	}()
	return c
}

// parentDir waits until the parent cgroup is prepared and returns it
// ("" when spawns get no cgroup).
func (c *cgroups) parentDir() string {
	if c == nil {
		return ""
	}
	if c.ready != nil {
		<-c.ready
	}
	return c.parent
}

// setupCgroupParent enables the memory controller below root, makes the
// spawns' parent with its memory limit (none when memTotal is 0) and
// returns its path.
func setupCgroupParent(root string, memTotal uint64) (string, error) {
	controllers, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return "", fmt.Errorf("no cgroup v2 at %s: %w", root, err)
	}
	if !slices.Contains(strings.Fields(string(controllers)), "memory") {
		return "", fmt.Errorf("the cgroup v2 at %s has no memory controller (controllers: %q)", root, strings.TrimSpace(string(controllers)))
	}
	if err := writeCgroupFile(root, "cgroup.subtree_control", "+memory"); err != nil {
		return "", err
	}
	parent := filepath.Join(root, spawnCgroupParent)
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating the spawns' cgroup: %w", err)
	}
	if err := writeCgroupFile(parent, "cgroup.subtree_control", "+memory"); err != nil {
		return "", err
	}
	if limit := spawnMemoryMax(memTotal); limit > 0 {
		if err := writeCgroupFile(parent, "memory.max", strconv.FormatUint(limit, 10)); err != nil {
			return "", err
		}
	}
	return parent, nil
}

// spawnMemoryMax is the spawns' memory limit, all together, in a guest of
// memTotal bytes: all of it but a reserve for the agent, its proxies and the
// kernel's own use (an eighth, from 64 MiB to 512 MiB); 0 (no limit) when
// memTotal is unknown or too small to spare one.
func spawnMemoryMax(memTotal uint64) uint64 {
	const mib = 1 << 20
	reserve := min(max(memTotal/8, 64*mib), 512*mib)
	if memTotal < 2*reserve {
		return 0
	}
	return memTotal - reserve
}

// readMemTotal is /proc/meminfo's MemTotal in bytes (0 when unknown).
func readMemTotal() uint64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return parseMemTotal(data)
}

// parseMemTotal reads the MemTotal line ("MemTotal:  1014452 kB").
func parseMemTotal(meminfo []byte) uint64 {
	s := bufio.NewScanner(bytes.NewReader(meminfo))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 3 && f[0] == "MemTotal:" && f[2] == "kB" {
			if kb, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

func writeCgroupFile(dir, name, value string) error {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(value), 0); err != nil {
		return fmt.Errorf("writing %q to %s: %w", value, filepath.Join(dir, name), err)
	}
	return nil
}

// spawnCgroup is one spawn's cgroup.
type spawnCgroup struct {
	dir string
	fd  int // O_DIRECTORY descriptor, for CLONE_INTO_CGROUP
}

// create makes the next spawn's cgroup; nil (no error) when spawns get
// none.
func (c *cgroups) create() (*spawnCgroup, error) {
	parent := c.parentDir()
	if parent == "" {
		return nil, nil
	}
	c.retryLingering()
	dir := filepath.Join(parent, strconv.FormatUint(c.next.Add(1), 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the process's cgroup: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Rmdir(dir)
		return nil, fmt.Errorf("opening the process's cgroup: %w", err)
	}
	return &spawnCgroup{dir: dir, fd: fd}, nil
}

// oomKills is the cgroup's oom_kill count; false when it cannot be read.
func (g *spawnCgroup) oomKills() (int, bool) {
	data, err := os.ReadFile(filepath.Join(g.dir, "memory.events"))
	if err != nil {
		return 0, false
	}
	return parseOOMKills(data)
}

// parseOOMKills reads memory.events' "oom_kill N" line.
func parseOOMKills(events []byte) (int, bool) {
	s := bufio.NewScanner(bytes.NewReader(events))
	for s.Scan() {
		key, value, ok := strings.Cut(s.Text(), " ")
		if !ok || key != "oom_kill" {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 31)
		if err != nil {
			return 0, false
		}
		return int(n), true
	}
	return 0, false
}

// release closes a spawn's cgroup after its exit and removes it, or keeps
// it for a later try while processes of the spawn are still in it.
func (c *cgroups) release(g *spawnCgroup) {
	if g == nil {
		return
	}
	unix.Close(g.fd)
	if err := unix.Rmdir(g.dir); err == nil || errors.Is(err, unix.ENOENT) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lingering) < maxLingeringCgroups {
		c.lingering = append(c.lingering, g.dir)
	} else {
		c.log.Warn("too many exited processes' cgroups still hold processes; leaving this one", "cgroup", g.dir)
	}
}

// retryLingering removes the exited spawns' cgroups that have emptied.
func (c *cgroups) retryLingering() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lingering = slices.DeleteFunc(c.lingering, func(dir string) bool {
		err := unix.Rmdir(dir)
		return err == nil || errors.Is(err, unix.ENOENT)
	})
}
