//go:build linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot/ninep"
)

const ninePMountPoint = "/mnt"

// ninePMode reads the 9p throughput mode from the kernel command line and,
// when it is on, runs it and returns the console line; ok is false when
// the mode is off.
func ninePMode(cmdline string) (line string, ok bool) {
	cfg, on, err := ninep.ParseCmdline(cmdline)
	if !on {
		return "", false
	}
	if err != nil {
		return ninep.Result{Err: err.Error()}.Line(), true
	}
	res, err := mountAndMeasure(cfg)
	if err != nil {
		return ninep.Result{Err: err.Error()}.Line(), true
	}
	return res.Line(), true
}

// mountAndMeasure mounts the 9p device, measures it and unmounts it.
func mountAndMeasure(cfg ninep.Config) (ninep.Result, error) {
	if err := os.MkdirAll(ninePMountPoint, 0o755); err != nil {
		return ninep.Result{}, err
	}
	opts := ninep.MountOptions
	if cfg.Aname != "" {
		opts += ",aname=" + cfg.Aname
	}
	if err := unix.Mount(cfg.Tag, ninePMountPoint, "9p", 0, opts); err != nil {
		return ninep.Result{}, fmt.Errorf("mount -t 9p -o %s %s %s: %w", opts, cfg.Tag, ninePMountPoint, err)
	}
	defer func() { _ = unix.Unmount(ninePMountPoint, 0) }()
	res, err := measure(filepath.Join(ninePMountPoint, ninep.FileName), cfg.MiB)
	if err != nil {
		return res, err
	}
	res.Msize = mountMsize(ninePMountPoint)
	return res, nil
}

// measure writes a file of mib blocks (one write() each, then fsync and
// close), reads it back through a fresh descriptor (one read() a block)
// and checks every block's content. Only the I/O is timed.
func measure(path string, mib int) (ninep.Result, error) {
	block := make([]byte, ninep.BlockSize)
	ninep.FillPattern(block)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return ninep.Result{}, err
	}
	start := time.Now()
	for i := range mib {
		ninep.StampBlock(block, i)
		if _, err := f.Write(block); err != nil { // os.File.Write retries short writes
			f.Close()
			return ninep.Result{}, fmt.Errorf("writing block %d: %w", i, err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return ninep.Result{}, fmt.Errorf("fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return ninep.Result{}, fmt.Errorf("close after writing: %w", err)
	}
	res := ninep.Result{Bytes: int64(mib) * ninep.BlockSize, Write: time.Since(start)}

	f, err = os.Open(path)
	if err != nil {
		return ninep.Result{}, err
	}
	defer f.Close()
	got := make([]byte, ninep.BlockSize)
	for i := range mib {
		t := time.Now()
		_, err := io.ReadFull(f, got)
		res.Read += time.Since(t)
		if err != nil {
			return ninep.Result{}, fmt.Errorf("reading block %d: %w", i, err)
		}
		ninep.StampBlock(block, i)
		if !bytes.Equal(got, block) {
			return ninep.Result{}, fmt.Errorf("block %d read back differs from what was written", i)
		}
	}
	if n, err := f.Read(got[:1]); n != 0 || !errors.Is(err, io.EOF) {
		return ninep.Result{}, fmt.Errorf("the file is longer than the %d MiB written (read %d, %v)", mib, n, err)
	}
	return res, nil
}

// mountMsize returns the msize option of the mount at dir, 0 if unknown.
func mountMsize(dir string) int {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[1] != dir {
			continue
		}
		for _, opt := range strings.Split(fields[3], ",") {
			if v, ok := strings.CutPrefix(opt, "msize="); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
	}
	return 0
}
