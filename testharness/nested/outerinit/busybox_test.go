//go:build linux

package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAppletLinks: the applets in the four bin directories become links;
// busybox itself, other places and paths that leave the root do not.
func TestAppletLinks(t *testing.T) {
	list := "bin/sh\nbin/busybox\nusr/bin/awk\r\nsbin/ip\nusr/sbin/chroot\nlinuxrc\n../bin/x\nbin/../../etc/x\n/bin/abs\nusr/local/bin/y\nbin/\n\n"
	require.Equal(t, []string{"bin/sh", "usr/bin/awk", "sbin/ip", "usr/sbin/chroot"}, appletLinks(list))
}
