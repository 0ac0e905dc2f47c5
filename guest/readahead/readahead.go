package readahead

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// VirtioFSKiB is the window for a virtio-fs mount: the largest read the
// device serves in one request (devices/virtiofs.MaxWrite, which FUSE_INIT
// offers as max_read and max_pages), so read-ahead fills whole requests.
const VirtioFSKiB = 1024

// sysfsBDI is where Linux lists backing device infos, by device number.
const sysfsBDI = "/sys/class/bdi"

// Set sets the read-ahead window of the file system holding the open file
// fd (e.g. a mount's root directory) to kib KiB.
func Set(fd, kib int) error {
	return set(sysfsBDI, fd, kib)
}

func set(bdiDir string, fd, kib int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("read-ahead: fstat: %w", err)
	}
	path := fmt.Sprintf("%s/%d:%d/read_ahead_kb", bdiDir, unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(path, []byte(strconv.Itoa(kib)), 0); err != nil {
		return fmt.Errorf("read-ahead of %d:%d: %w", unix.Major(st.Dev), unix.Minor(st.Dev), err)
	}
	return nil
}
