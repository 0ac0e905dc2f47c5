package hostfs

import (
	"strings"

	"golang.org/x/sys/unix"
)

// maxNameLen is the longest path component Linux accepts.
const maxNameLen = 255

// checkName refuses anything but one ordinary path component.
func checkName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return unix.EINVAL
	case len(name) > maxNameLen:
		return unix.ENAMETOOLONG
	case strings.ContainsAny(name, "/\x00"):
		return unix.EINVAL
	}
	return nil
}
