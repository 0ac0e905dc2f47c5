package fs

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// ErrExportExists is returned by Exports.Add for a name already registered.
var ErrExportExists = errors.New("export name already registered")

// Exports is the run-time registry of exports and the p9.Attacher that
// serves them. The attach root is a virtual, read-only, unlistable
// directory whose children are the export names, so the guest mounts an
// export with aname=<name>. Safe for concurrent use.
type Exports struct {
	log *slog.Logger

	mu      sync.RWMutex
	exports map[string]*export
}

// export is one registered host directory.
type export struct {
	name     string
	hostDir  string
	readOnly bool
	// rootFd is an O_PATH descriptor of hostDir, opened at registration;
	// everything the guest reaches is resolved beneath it.
	rootFd int
	// refs counts the root descriptor's users (the registry and every
	// open File of the export); the descriptor is closed at zero.
	mu   sync.Mutex
	refs int
}

func (e *export) acquire() {
	e.mu.Lock()
	e.refs++
	e.mu.Unlock()
}

func (e *export) release() {
	e.mu.Lock()
	e.refs--
	last := e.refs == 0
	e.mu.Unlock()
	if last {
		_ = unix.Close(e.rootFd)
	}
}

// NewExports returns an empty registry. logger nil = slog.Default().
func NewExports(logger *slog.Logger) *Exports {
	if logger == nil {
		logger = slog.Default()
	}
	return &Exports{log: logger, exports: make(map[string]*export)}
}

// Add registers hostDir under name. name must be one safe path component
// (the guest's aname); hostDir must be an existing directory (symlinks in
// hostDir itself are resolved once, here, by the host). The directory is
// opened now: a later rename of hostDir on the host does not redirect the
// export.
func (x *Exports) Add(name, hostDir string, readOnly bool) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("p9 export name %q: %w", name, err)
	}
	fd, err := unix.Open(hostDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("p9 export %q: open %s: %w", name, hostDir, err)
	}
	ex := &export{name: name, hostDir: hostDir, readOnly: readOnly, rootFd: fd, refs: 1}
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.exports[name]; ok {
		_ = unix.Close(fd)
		return fmt.Errorf("p9 export %q: %w", name, ErrExportExists)
	}
	x.exports[name] = ex
	x.log.Info("p9 export added", "name", name, "dir", hostDir, "readOnly", readOnly)
	return nil
}

// Remove unregisters name. New attaches to it fail; files the guest
// already holds keep working until it clunks them. Removing an unknown
// name is not an error.
func (x *Exports) Remove(name string) {
	x.mu.Lock()
	ex, ok := x.exports[name]
	delete(x.exports, name)
	x.mu.Unlock()
	if ok {
		ex.release()
		x.log.Info("p9 export removed", "name", name)
	}
}

// Names lists the registered export names, sorted.
func (x *Exports) Names() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	names := make([]string, 0, len(x.exports))
	for n := range x.exports {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Close unregisters every export.
func (x *Exports) Close() {
	for _, n := range x.Names() {
		x.Remove(n)
	}
}

func (x *Exports) lookup(name string) (*export, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	ex, ok := x.exports[name]
	if ok {
		ex.acquire()
	}
	return ex, ok
}

// Attach implements p9.Attacher: it returns the virtual root.
func (x *Exports) Attach() (p9.File, error) {
	return &rootFile{exports: x}, nil
}

var _ p9.Attacher = (*Exports)(nil)
