package hostfs

import (
	"errors"

	"golang.org/x/sys/unix"
)

// SyncWritable flushes to stable storage the host file systems that hold
// the writable exports (syncfs(2), once per file system): the guest's
// sync(2) of the whole share. Read-only and withdrawn exports are skipped.
// It returns the first failure, after trying every file system.
func (x *Exports) SyncWritable() error {
	x.mu.RLock()
	exports := make([]*export, 0, len(x.exports))
	for _, ex := range x.exports {
		if !ex.readOnly {
			exports = append(exports, ex)
		}
	}
	x.mu.RUnlock()
	synced := make(map[uint64]bool)
	var errs []error
	for _, ex := range exports {
		if err := ex.syncFS(synced); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncFS syncs the file system of e's root unless synced holds its device
// already, and records it there.
func (e *export) syncFS(synced map[uint64]bool) error {
	if e.enter() != nil {
		return nil // withdrawn: nothing of it is the guest's to sync
	}
	defer e.exit()
	var st unix.Stat_t
	if err := unix.Fstat(e.rootFd, &st); err != nil {
		return err
	}
	if synced[st.Dev] {
		return nil
	}
	synced[st.Dev] = true
	// syncfs takes no O_PATH descriptor: open the root itself, read-only,
	// through our own descriptor of it.
	fd, err := unix.Open(procPath(e.rootFd), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}
