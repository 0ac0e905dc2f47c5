package vm

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
	"os"

	"github.com/cowork-vmm/cowork-vmm/guest/initramfs"
)

// InitramfsFiles lists the guest's initial root: the helper's executable
// as /init (it runs the agent when it is PID 1), /dev/console so the
// kernel gives /init a console before devtmpfs is mounted (the agent's log
// goes there), and the mount points the agent uses. The root is the
// kernel's rootfs (a tmpfs), so everything the guest writes outside its
// mounts stays in guest RAM.
func InitramfsFiles(executable string) []initramfs.File {
	dir := func(p string, perm fs.FileMode) initramfs.File {
		return initramfs.File{Path: p, Mode: fs.ModeDir | perm}
	}
	return []initramfs.File{
		{Path: "init", Mode: 0o755, HostPath: executable},
		dir("dev", 0o755),
		{Path: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, Major: 5, Minor: 1},
		{Path: "dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666, Major: 1, Minor: 3},
		dir("proc", 0o555),
		dir("sys", 0o555),
		dir("tmp", 0o777|fs.ModeSticky),
		dir("run", 0o755),
		dir("sessions", 0o755),
		dir("root", 0o700),
		dir("usr/local/bin", 0o755),
	}
}

// buildInitramfs returns the initramfs for executable, gzip-compressed at
// BestSpeed when compress is set. Uncompressed is the default: the kernel
// then only copies the archive, where inflating it in the guest costs more
// boot time than the larger image costs to load.
func buildInitramfs(executable string, compress bool) ([]byte, error) {
	var b bytes.Buffer
	if info, err := os.Stat(executable); err == nil && !compress {
		b.Grow(int(min(info.Size(), 1<<30)) + 64<<10) // the archive is the executable plus headers
	}
	files := InitramfsFiles(executable)
	var err error
	if compress {
		err = initramfs.WriteGzip(&b, files, gzip.BestSpeed)
	} else {
		err = initramfs.Write(&b, files)
	}
	if err != nil {
		return nil, fmt.Errorf("building the guest initramfs from %s: %w", executable, err)
	}
	return b.Bytes(), nil
}
