//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// appletDirs are the root's directories that hold busybox's applet links.
var appletDirs = []string{"bin", "sbin", "usr/bin", "usr/sbin"}

// etcFiles is the userland root's /etc where the packages left it out:
// enough for programs that look up root or nobody, localhost, or a
// resolver (none: no network here).
var etcFiles = map[string]string{
	"etc/passwd":      "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
	"etc/group":       "root:x:0:\nnogroup:x:65534:\n",
	"etc/hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
	"etc/resolv.conf": "",
}

// Where the userland root's parts are mounted in the outer guest.
const (
	userlandLower = "/userland"    // the shared root, read-only
	userlandRW    = "/userland-rw" // tmpfs: the overlay's upper and work dirs
)

// buildUserlandRoot assembles a UserlandRoot job's root at newRoot: the
// arm64 userland the harness shares (job.UserlandTag, read-only) under an
// overlay whose writes go to a tmpfs, with a link to job.Busybox for each
// applet no package provides, a minimal /etc where the packages have none,
// debugfs (the bench reads KVM's exit counters there) and the fresh
// directories of the host-root variant (proc, sys, dev, tmp, run, root,
// payload). The VMM's guests, which share its system directories, find a
// working sh, curl and the dynamic loader there.
func buildUserlandRoot() error {
	if err := mount(job.UserlandTag, userlandLower, "9p", unix.MS_RDONLY, ninePOptions+",cache=loose"); err != nil {
		return fmt.Errorf("%w (is the arm64 userland shared?)", err)
	}
	if err := mount("tmpfs", userlandRW, "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	upper, work := filepath.Join(userlandRW, "upper"), filepath.Join(userlandRW, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("userland root: %w", err)
		}
	}
	opts := "lowerdir=" + userlandLower + ",upperdir=" + upper + ",workdir=" + work
	if err := mount("overlay", newRoot, "overlay", 0, opts); err != nil {
		return fmt.Errorf("userland root: %w", err)
	}
	if err := populateUserlandRoot(); err != nil {
		return fmt.Errorf("userland root: %w", err)
	}
	if err := mountFreshDirs(); err != nil {
		return err
	}
	if err := mount("debugfs", filepath.Join(newRoot, "sys/kernel/debug"), "debugfs", 0, ""); err != nil {
		return err
	}
	return mountDevExtras()
}

// populateUserlandRoot adds to the overlay what the packages lack:
// directories, busybox's applet links, /etc's files.
func populateUserlandRoot() error {
	for _, d := range append([]string{"etc", "var/tmp"}, appletDirs...) {
		if err := os.MkdirAll(filepath.Join(newRoot, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(newRoot, "var/tmp"), 0o1777); err != nil {
		return err
	}
	list, err := exec.Command(filepath.Join(newRoot, job.Busybox), "--list-full").Output()
	if err != nil {
		return fmt.Errorf("listing busybox's applets: %w", err)
	}
	for _, link := range appletLinks(string(list)) {
		if err := os.Symlink(job.Busybox, filepath.Join(newRoot, link)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	for name, content := range etcFiles {
		p := filepath.Join(newRoot, name)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// appletLinks picks, from `busybox --list-full` (one "usr/bin/awk" a
// line), the links to make: those in appletDirs, not busybox itself.
func appletLinks(list string) []string {
	var links []string
	self := strings.TrimPrefix(job.Busybox, "/")
	for _, line := range strings.Split(list, "\n") {
		p := strings.TrimSpace(line)
		if p == "" || p == self || !filepath.IsLocal(p) || filepath.Clean(p) != p {
			continue
		}
		dir, name := filepath.Split(p)
		if name == "" {
			continue
		}
		for _, d := range appletDirs {
			if strings.TrimSuffix(dir, "/") == d {
				links = append(links, p)
				break
			}
		}
	}
	return links
}
