package vm

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"

	"github.com/cowork-vmm/cowork-vmm/guest/initramfs"
	"github.com/cowork-vmm/cowork-vmm/vmm/loader"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
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

// initramfsSource is the uncompressed initramfs for an executable, streamed
// straight into guest memory when the machine loads it: the helper never
// holds the archive (the size of its executable) in its own memory.
type initramfsSource struct {
	files []initramfs.File
	size  uint64
}

// newInitramfsSource sizes the initramfs for executable (a stat, no read).
func newInitramfsSource(executable string) (initramfsSource, error) {
	files := InitramfsFiles(executable)
	size, err := initramfs.Size(files)
	if err != nil {
		return initramfsSource{}, fmt.Errorf("building the guest initramfs from %s: %w", executable, err)
	}
	return initramfsSource{files: files, size: uint64(size)}, nil
}

// Size implements loader.InitrdSource.
func (s initramfsSource) Size() uint64 { return s.size }

// WriteTo implements loader.InitrdSource.
func (s initramfsSource) WriteTo(mem x86.GuestWriter, addr uint64) error {
	err := loader.WriteStream(mem, addr, s.size, func(w io.Writer) error { return initramfs.Write(w, s.files) })
	if err != nil {
		return fmt.Errorf("writing the guest initramfs (was the executable replaced while the VM started?): %w", err)
	}
	return nil
}

// buildGzipInitramfs returns the initramfs for executable, gzip-compressed
// at BestSpeed (Options.CompressInitramfs). Uncompressed is the default:
// the kernel then only copies the archive, where inflating it in the guest
// costs more boot time than the larger image costs to load.
func buildGzipInitramfs(executable string) ([]byte, error) {
	var b bytes.Buffer
	if err := initramfs.WriteGzip(&b, InitramfsFiles(executable), gzip.BestSpeed); err != nil {
		return nil, fmt.Errorf("building the guest initramfs from %s: %w", executable, err)
	}
	return b.Bytes(), nil
}
