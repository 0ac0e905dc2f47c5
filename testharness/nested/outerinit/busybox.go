//go:build linux

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested/job"
)

// appletDirs are the root's directories that hold busybox's applet links.
var appletDirs = []string{"bin", "sbin", "usr/bin", "usr/sbin"}

// etcFiles is the busybox root's /etc: enough for programs that look up
// root or nobody, localhost, or a resolver (none: no network here).
var etcFiles = map[string]string{
	"etc/passwd":      "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
	"etc/group":       "root:x:0:\nnogroup:x:65534:\n",
	"etc/hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost\n",
	"etc/resolv.conf": "",
}

// buildBusyboxRoot assembles a BusyboxRoot job's root at newRoot: a tmpfs
// with job.Busybox and a link to it for each applet it lists, a minimal
// /etc, and the fresh directories of the host-root variant (proc, sys,
// dev, tmp, run, root, payload). The root is a real arm64 userland, so the
// VMM's guests, which share its system directories, find a working sh.
func buildBusyboxRoot() error {
	if err := mount("tmpfs", newRoot, "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	for _, d := range append([]string{"etc", "var/tmp"}, appletDirs...) {
		if err := os.MkdirAll(filepath.Join(newRoot, d), 0o755); err != nil {
			return fmt.Errorf("busybox root: %w", err)
		}
	}
	if err := os.Chmod(filepath.Join(newRoot, "var/tmp"), 0o1777); err != nil {
		return fmt.Errorf("busybox root: %w", err)
	}
	if err := copyExecutable(filepath.Join(newRoot, job.Busybox), job.Busybox); err != nil {
		return fmt.Errorf("busybox root: %w", err)
	}
	list, err := exec.Command(job.Busybox, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox root: listing the applets: %w", err)
	}
	for _, link := range appletLinks(string(list)) {
		if err := os.Symlink(job.Busybox, filepath.Join(newRoot, link)); err != nil && !os.IsExist(err) {
			return fmt.Errorf("busybox root: %w", err)
		}
	}
	for name, content := range etcFiles {
		if err := os.WriteFile(filepath.Join(newRoot, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("busybox root: %w", err)
		}
	}
	if err := mountFreshDirs(); err != nil {
		return err
	}
	return mountDevExtras()
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

// copyExecutable copies src to dst with mode 0755.
func copyExecutable(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
