package p9

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/hugelgupf/p9/linux"
	p9lib "github.com/hugelgupf/p9/p9"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
)

// The server calls the Attacher's files on its own goroutines, which the
// device does not control. Every file the server sees is wrapped here
// (guardedFile), so that:
//   - a panic in a file operation becomes EIO for that request (the
//     server answers it with Rlerror), is logged (rate-limited), and the
//     server keeps serving; hugelgupf/p9 would answer EFAULT and log
//     nowhere;
//   - a file operation that ends its goroutine instead of returning
//     (runtime.Goexit) leaves a request the server will never answer: the
//     bridge is told its server is dead (bridge.fail), and the goroutine is
//     parked rather than let end: the end of the server's first goroutine
//     runs the clean-up that races (see bridge.go).

// errServerGoroutineExited is why a bridge fails when a server goroutine
// ended in the middle of serving a request.
var errServerGoroutineExited = errors.New("virtio-9p: a 9P server goroutine exited while serving a request")

// guard runs the file operations of one bridge's server and keeps the
// files the server holds, so that they can be closed when it dies.
type guard struct {
	panics *ratelog.Logger
	// exited is called when a file operation ended its goroutine.
	exited func(error)

	mu    sync.Mutex
	files map[*guardedFile]struct{} // open: wrapped and not yet closed
}

func newGuard(panics *ratelog.Logger, exited func(error)) *guard {
	return &guard{panics: panics, exited: exited, files: make(map[*guardedFile]struct{})}
}

// run calls op, the file operation named name. A panic in op is logged
// and returned as EIO; op ending its goroutine is reported to g.exited and
// the goroutine parked.
func (g *guard) run(name string, op func() error) (err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			g.panics.Error("virtio-9p: a file operation panicked; answering EIO",
				"op", name, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = linux.EIO
			return
		}
		g.exited(fmt.Errorf("%w (in %s)", errServerGoroutineExited, name))
		park() // ending, the goroutine would run the server's racy clean-up
	}()
	err = op()
	returned = true
	return err
}

// wrap guards f, the file an operation returned with err, and records it
// as open. With an error (which makes the server drop f) or no file, f is
// returned as it is.
func (g *guard) wrap(f p9lib.File, err error) p9lib.File {
	if f == nil || err != nil {
		return f
	}
	gf := &guardedFile{f: f, g: g}
	g.mu.Lock()
	g.files[gf] = struct{}{}
	g.mu.Unlock()
	return gf
}

// closeAll closes every file the server still holds: a dead server never
// clunks them. Later Close calls of the server on them do nothing.
func (g *guard) closeAll() {
	g.mu.Lock()
	files := g.files
	g.files = make(map[*guardedFile]struct{})
	g.mu.Unlock()
	for gf := range files {
		_ = gf.closeOnce()
	}
}

// unwrap returns the Attacher's file behind f, for the operations that
// take another file (Link, Rename, RenameAt, Renamed): the Attacher's
// files check that it is one of theirs.
func unwrap(f p9lib.File) p9lib.File {
	if gf, ok := f.(*guardedFile); ok {
		return gf.f
	}
	return f
}

// guardedAttacher is the Attacher the server sees.
type guardedAttacher struct {
	a p9lib.Attacher
	g *guard
}

func (a guardedAttacher) Attach() (f p9lib.File, err error) {
	err = a.g.run("Attach", func() error {
		f, err = a.a.Attach()
		return err
	})
	return a.g.wrap(f, err), err
}

// guardedFile is a file the server holds: each method runs the wrapped
// file's through the guard.
type guardedFile struct {
	f    p9lib.File
	g    *guard
	once sync.Once
}

var _ p9lib.File = (*guardedFile)(nil)

func (f *guardedFile) Walk(names []string) (qids []p9lib.QID, file p9lib.File, err error) {
	err = f.g.run("Walk", func() error {
		qids, file, err = f.f.Walk(names)
		return err
	})
	return qids, f.g.wrap(file, err), err
}

func (f *guardedFile) WalkGetAttr(names []string) (qids []p9lib.QID, file p9lib.File, valid p9lib.AttrMask, attr p9lib.Attr, err error) {
	err = f.g.run("WalkGetAttr", func() error {
		qids, file, valid, attr, err = f.f.WalkGetAttr(names)
		return err
	})
	return qids, f.g.wrap(file, err), valid, attr, err
}

func (f *guardedFile) StatFS() (st p9lib.FSStat, err error) {
	err = f.g.run("StatFS", func() error {
		st, err = f.f.StatFS()
		return err
	})
	return st, err
}

func (f *guardedFile) GetAttr(req p9lib.AttrMask) (qid p9lib.QID, valid p9lib.AttrMask, attr p9lib.Attr, err error) {
	err = f.g.run("GetAttr", func() error {
		qid, valid, attr, err = f.f.GetAttr(req)
		return err
	})
	return qid, valid, attr, err
}

func (f *guardedFile) SetAttr(valid p9lib.SetAttrMask, attr p9lib.SetAttr) error {
	return f.g.run("SetAttr", func() error { return f.f.SetAttr(valid, attr) })
}

// Close closes the wrapped file once: after closeAll, the server's own
// Close does nothing.
func (f *guardedFile) Close() error {
	f.g.mu.Lock()
	delete(f.g.files, f)
	f.g.mu.Unlock()
	return f.closeOnce()
}

func (f *guardedFile) closeOnce() (err error) {
	f.once.Do(func() { err = f.g.run("Close", f.f.Close) })
	return err
}

func (f *guardedFile) Open(mode p9lib.OpenFlags) (qid p9lib.QID, ioUnit uint32, err error) {
	err = f.g.run("Open", func() error {
		qid, ioUnit, err = f.f.Open(mode)
		return err
	})
	return qid, ioUnit, err
}

func (f *guardedFile) ReadAt(p []byte, offset int64) (n int, err error) {
	err = f.g.run("ReadAt", func() error {
		n, err = f.f.ReadAt(p, offset)
		return err
	})
	return n, err
}

func (f *guardedFile) WriteAt(p []byte, offset int64) (n int, err error) {
	err = f.g.run("WriteAt", func() error {
		n, err = f.f.WriteAt(p, offset)
		return err
	})
	return n, err
}

func (f *guardedFile) SetXattr(attr string, data []byte, flags p9lib.XattrFlags) error {
	return f.g.run("SetXattr", func() error { return f.f.SetXattr(attr, data, flags) })
}

func (f *guardedFile) GetXattr(attr string) (data []byte, err error) {
	err = f.g.run("GetXattr", func() error {
		data, err = f.f.GetXattr(attr)
		return err
	})
	return data, err
}

func (f *guardedFile) ListXattrs() (names []string, err error) {
	err = f.g.run("ListXattrs", func() error {
		names, err = f.f.ListXattrs()
		return err
	})
	return names, err
}

func (f *guardedFile) RemoveXattr(attr string) error {
	return f.g.run("RemoveXattr", func() error { return f.f.RemoveXattr(attr) })
}

func (f *guardedFile) FSync() error { return f.g.run("FSync", f.f.FSync) }

func (f *guardedFile) Lock(pid int, locktype p9lib.LockType, flags p9lib.LockFlags, start, length uint64, client string) (status p9lib.LockStatus, err error) {
	err = f.g.run("Lock", func() error {
		status, err = f.f.Lock(pid, locktype, flags, start, length, client)
		return err
	})
	return status, err
}

func (f *guardedFile) Create(name string, flags p9lib.OpenFlags, permissions p9lib.FileMode, uid p9lib.UID, gid p9lib.GID) (file p9lib.File, qid p9lib.QID, ioUnit uint32, err error) {
	err = f.g.run("Create", func() error {
		file, qid, ioUnit, err = f.f.Create(name, flags, permissions, uid, gid)
		return err
	})
	return f.g.wrap(file, err), qid, ioUnit, err
}

func (f *guardedFile) Mkdir(name string, permissions p9lib.FileMode, uid p9lib.UID, gid p9lib.GID) (qid p9lib.QID, err error) {
	err = f.g.run("Mkdir", func() error {
		qid, err = f.f.Mkdir(name, permissions, uid, gid)
		return err
	})
	return qid, err
}

func (f *guardedFile) Symlink(oldName, newName string, uid p9lib.UID, gid p9lib.GID) (qid p9lib.QID, err error) {
	err = f.g.run("Symlink", func() error {
		qid, err = f.f.Symlink(oldName, newName, uid, gid)
		return err
	})
	return qid, err
}

func (f *guardedFile) Link(target p9lib.File, newName string) error {
	return f.g.run("Link", func() error { return f.f.Link(unwrap(target), newName) })
}

func (f *guardedFile) Mknod(name string, mode p9lib.FileMode, major, minor uint32, uid p9lib.UID, gid p9lib.GID) (qid p9lib.QID, err error) {
	err = f.g.run("Mknod", func() error {
		qid, err = f.f.Mknod(name, mode, major, minor, uid, gid)
		return err
	})
	return qid, err
}

func (f *guardedFile) Rename(newDir p9lib.File, newName string) error {
	return f.g.run("Rename", func() error { return f.f.Rename(unwrap(newDir), newName) })
}

func (f *guardedFile) RenameAt(oldName string, newDir p9lib.File, newName string) error {
	return f.g.run("RenameAt", func() error { return f.f.RenameAt(oldName, unwrap(newDir), newName) })
}

func (f *guardedFile) UnlinkAt(name string, flags uint32) error {
	return f.g.run("UnlinkAt", func() error { return f.f.UnlinkAt(name, flags) })
}

func (f *guardedFile) Readdir(offset uint64, count uint32) (entries p9lib.Dirents, err error) {
	err = f.g.run("Readdir", func() error {
		entries, err = f.f.Readdir(offset, count)
		return err
	})
	return entries, err
}

func (f *guardedFile) Readlink() (target string, err error) {
	err = f.g.run("Readlink", func() error {
		target, err = f.f.Readlink()
		return err
	})
	return target, err
}

func (f *guardedFile) Renamed(newDir p9lib.File, newName string) {
	_ = f.g.run("Renamed", func() error {
		f.f.Renamed(unwrap(newDir), newName)
		return nil
	})
}

// serverLog is the server's logger (p9lib.WithServerLogger). It passes on
// only what the device cannot see otherwise: a panic the server recovered
// in its own handler code (it answers EFAULT), rate-limited; a file
// operation's failure is logged by the guard first. The server's
// other lines trace every message, or report stream errors the bridge
// never causes.
type serverLog struct{ log *ratelog.Logger }

func (l serverLog) Printf(format string, v ...any) {
	if strings.HasPrefix(format, "panic in handler") {
		l.log.Error("virtio-9p: a 9P server handler failed outside a file operation (the server answers EFAULT)",
			"detail", fmt.Sprintf(format, v...))
	}
}

func (l serverLog) Print(...any) {}
