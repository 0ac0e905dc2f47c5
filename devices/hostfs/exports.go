package hostfs

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
)

// ErrExportExists is returned by Exports.Add for a name already registered.
var ErrExportExists = errors.New("export name already registered")

// Exports is the run-time registry of exports. Its Root is a virtual,
// read-only, unlistable directory whose children are the export names, so
// the guest mounts an export by its name (9P's aname). Safe for
// concurrent use.
type Exports struct {
	log *slog.Logger
	// budget bounds the host descriptors the files of every export hold
	// (see the package doc); ownBudget says Close closes it.
	budget    *fdlimit.Share
	ownBudget bool

	mu      sync.RWMutex
	exports map[string]*export
	serial  uint64 // the last export's serial (guarded by mu)
}

// export is one registered host directory, or one host file shown in a
// directory of its own (a single-file export).
type export struct {
	serial   uint64 // unique within its Exports, never 0 (see Key)
	name     string
	hostPath string
	readOnly bool
	// viewName is set for a single-file export: the one name its root
	// lists and lets the guest walk to. fileName is the host file's own
	// name beneath rootFd (they differ when the registered path was a
	// symlink, resolved at registration).
	viewName string
	fileName string
	// pinned is set for an immutable single-file export
	// (AddImmutableFile): pinFd, an O_PATH descriptor of the file as
	// registered, is what its one name leads to, whatever the host puts
	// at that name later. Closed by revoke, under gate.
	pinned bool
	pinFd  int

	// budget is the Exports' descriptor budget: every descriptor a file
	// of the export holds is acquired from it first (acquire).
	budget *fdlimit.Share

	// gate is held shared by every operation while it uses a descriptor
	// of the export, and exclusively by revoke, so no descriptor is closed
	// (and its number reused) under a running operation.
	gate sync.RWMutex
	// revoked (guarded by gate) is set by revoke: every operation then
	// fails with ESTALE.
	revoked bool
	// rootFd is an O_PATH descriptor of the exported directory (of the
	// file's directory, for a single-file export), opened at registration;
	// everything the guest reaches is resolved beneath it. Closed by
	// revoke, under gate.
	rootFd int

	// shownAs, when set, is the owner the guest is shown for what the
	// helper (hostUID, hostGID) owns (ShowOwnedAs).
	shownAs          *Owner
	hostUID, hostGID uint32

	// filesMu guards files, every file of the export that still holds
	// descriptors (revoke closes them).
	filesMu sync.Mutex
	files   map[*file]struct{}
}

// enter starts an operation that uses the export's descriptors: it holds
// the gate shared until exit, or fails with ESTALE once the export is
// withdrawn. Operations never nest enter calls (a waiting revoke would
// block the inner one).
func (e *export) enter() error {
	e.gate.RLock()
	if e.revoked {
		e.gate.RUnlock()
		return unix.ESTALE
	}
	return nil
}

func (e *export) exit() { e.gate.RUnlock() }

// track records a file that holds descriptors of the export; called
// between enter and exit, so never after revoke.
func (e *export) track(f *file) {
	e.filesMu.Lock()
	e.files[f] = struct{}{}
	e.filesMu.Unlock()
}

// acquire takes n descriptors from the budget for a file about to open
// them: ENFILE when the budget is spent. The caller releases them if the
// open fails, and closeDescriptors when the file closes them.
func (e *export) acquire(n int) error {
	if !e.budget.Acquire(n) {
		return unix.ENFILE
	}
	return nil
}

// release gives back n descriptors acquired and closed (or never opened).
func (e *export) release(n int) { e.budget.Release(n) }

// forget drops a file whose descriptors are closed.
func (e *export) forget(f *file) {
	e.filesMu.Lock()
	delete(e.files, f)
	e.filesMu.Unlock()
}

// revoke withdraws the export: it waits for the operations in progress,
// then closes every descriptor the export and its files hold. The files
// stay allocated until their client closes them, but every operation on them
// fails with ESTALE from now on.
func (e *export) revoke() {
	e.gate.Lock()
	defer e.gate.Unlock()
	if e.revoked {
		return
	}
	e.revoked = true
	e.filesMu.Lock()
	files := e.files
	e.files = make(map[*file]struct{})
	e.filesMu.Unlock()
	for f := range files {
		f.closeDescriptors()
	}
	_ = unix.Close(e.rootFd)
	e.rootFd = -1
	if e.pinned {
		_ = unix.Close(e.pinFd)
		e.pinFd = -1
	}
}

// viewFile opens a new O_PATH descriptor of a single-file export's file,
// beneath dirFd (a descriptor of the directory holding it): the pinned
// file itself for an immutable export, else what its name names now,
// which must be a regular file (ENOENT otherwise). Called between enter
// and exit.
func (e *export) viewFile(dirFd int) (int, *unix.Stat_t, error) {
	if !e.pinned {
		return openRegularBeneath(dirFd, e.fileName)
	}
	fd, err := dupFd(e.pinFd)
	if err != nil {
		return -1, nil, err
	}
	st, err := fstat(fd)
	if err != nil {
		_ = unix.Close(fd)
		return -1, nil, err
	}
	return fd, st, nil
}

// isFileView says whether this is a single-file export.
func (e *export) isFileView() bool { return e.viewName != "" }

// NewExports returns an empty registry with a descriptor budget of its
// own, a pool under the process's current RLIMIT_NOFILE (see
// NewExportsWithin). logger nil = slog.Default().
func NewExports(logger *slog.Logger) *Exports {
	x := NewExportsWithin(logger, fdlimit.NewPool(0).Share(0))
	x.ownBudget = true
	return x
}

// NewExportsWithin returns an empty registry whose files hold at most
// what budget allows (a device's share of the helper-wide pool): every
// host descriptor a file holds — a walked node's, an open file's, the
// clones a client opens — is acquired from it, and an operation that
// would pass it fails with ENFILE. The caller keeps budget and closes it
// after Close. logger nil = slog.Default().
func NewExportsWithin(logger *slog.Logger, budget *fdlimit.Share) *Exports {
	if logger == nil {
		logger = slog.Default()
	}
	return &Exports{log: logger, budget: budget, exports: make(map[string]*export)}
}

// Add registers hostDir under name. name must be one safe path component
// (the guest's aname); hostDir must be an existing directory (symlinks in
// hostDir itself are resolved once, here, by the host). The directory is
// opened now: a later rename of hostDir on the host does not redirect the
// export.
func (x *Exports) Add(name, hostDir string, readOnly bool, opts ...Option) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("export name %q: %w", name, err)
	}
	fd, err := unix.Open(hostDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("export %q: open %s: %w", name, hostDir, err)
	}
	return x.register(&export{name: name, hostPath: hostDir, readOnly: readOnly, rootFd: fd}, opts)
}

// AddFile registers a single-file export of hostFile under name. Its root
// is a directory that holds one name, filepath.Base(hostFile), and nothing
// else: a walk to any other name fails with ENOENT, a listing shows only
// that name, and no name in it can be created, removed or renamed (EPERM;
// EROFS when read-only). The file itself is read and, unless readOnly,
// written in place.
//
// hostFile must name a regular file; a symlink there (a dotfile manager's
// ~/.gitconfig, say) is resolved once, here, by the host. The directory
// holding the file is opened now, so a later rename of a directory on the
// host does not redirect the export. The file is found by its name beneath
// that descriptor (beneath.OpenAt: openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, never
// following a final symlink) each time the guest walks to it, opens it or
// asks for its attributes through an unopened Node: an editor that saves by
// writing a new file and renaming it over the old one is seen at once. If
// the name is missing or no longer names a regular file (a symlink or a
// directory put there), the guest keeps the last regular file it reached.
func (x *Exports) AddFile(name, hostFile string, readOnly bool, opts ...Option) error {
	return x.addFile(name, hostFile, readOnly, false, opts)
}

// AddImmutableFile registers a read-only single-file export of hostFile
// under name (as AddFile), pinned to the file hostFile names now: its one
// name leads to that inode for as long as the export lives, also once the
// host has renamed another file over it or removed it. It is for a file
// the guest caches for good (the installed SDK binary, on the cached
// device): the pages the guest cached and those it reads later are always
// of one file. A file that changes is shared again as a new export (the
// guest then caches it afresh) and the old one removed. Its contents are
// what the host file holds: a file rewritten in place changes under it,
// which is why the helper keys its share on the file's size and mtime too.
func (x *Exports) AddImmutableFile(name, hostFile string) error {
	return x.addFile(name, hostFile, true, true, nil)
}

// addFile is AddFile, the file pinned if pin (AddImmutableFile).
func (x *Exports) addFile(name, hostFile string, readOnly, pin bool, opts []Option) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("export name %q: %w", name, err)
	}
	view := filepath.Base(hostFile)
	if err := checkName(view); err != nil || !filepath.IsAbs(hostFile) {
		return fmt.Errorf("export %q: %s does not name a file", name, hostFile)
	}
	resolved, err := filepath.EvalSymlinks(hostFile)
	if err != nil {
		return fmt.Errorf("export %q: %w", name, err)
	}
	dirFd, err := unix.Open(filepath.Dir(resolved), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("export %q: open the directory of %s: %w", name, resolved, err)
	}
	ex := &export{name: name, hostPath: hostFile, readOnly: readOnly, rootFd: dirFd,
		viewName: view, fileName: filepath.Base(resolved)}
	fd, _, err := openRegularBeneath(dirFd, ex.fileName)
	if err != nil {
		_ = unix.Close(dirFd)
		return fmt.Errorf("export %q: %s is not a regular file that can be opened: %w", name, resolved, err)
	}
	if !pin {
		_ = unix.Close(fd)
	} else {
		ex.pinned, ex.pinFd = true, fd
	}
	return x.register(ex, opts)
}

// register adds ex (which owns an open rootFd), changed by opts, to the
// registry.
func (x *Exports) register(ex *export, opts []Option) error {
	for _, opt := range opts {
		opt(ex)
	}
	ex.files = make(map[*file]struct{})
	ex.budget = x.budget
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.exports[ex.name]; ok {
		_ = unix.Close(ex.rootFd)
		if ex.pinned {
			_ = unix.Close(ex.pinFd)
		}
		return fmt.Errorf("export %q: %w", ex.name, ErrExportExists)
	}
	x.serial++
	ex.serial = x.serial
	x.exports[ex.name] = ex
	x.log.Info("export added", "name", ex.name, "path", ex.hostPath, "readOnly", ex.readOnly, "singleFile", ex.isFileView())
	return nil
}

// Remove withdraws name: new attaches to it fail (ENOENT), every file the
// guest already holds in it fails every operation with ESTALE, and every
// host descriptor the export held is closed before Remove returns (it
// waits for operations in progress on the export). The client's Nodes
// stay allocated until it closes them. Removing an unknown name is not an
// error.
func (x *Exports) Remove(name string) {
	x.mu.Lock()
	ex, ok := x.exports[name]
	delete(x.exports, name)
	x.mu.Unlock()
	if ok {
		ex.revoke()
		x.log.Info("export removed", "name", name)
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

// Close unregisters every export (and ends a budget of its own).
func (x *Exports) Close() {
	for _, n := range x.Names() {
		x.Remove(n)
	}
	if x.ownBudget {
		x.budget.Close()
	}
}

func (x *Exports) lookup(name string) (*export, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	ex, ok := x.exports[name]
	return ex, ok
}
