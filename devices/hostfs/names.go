package hostfs

import (
	"errors"
	"strings"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// maxNameLen is the longest path component Linux accepts.
const maxNameLen = 255

// checkName refuses anything but one ordinary path component.
func checkName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return linux.EINVAL
	case len(name) > maxNameLen:
		return linux.ENAMETOOLONG
	case strings.ContainsAny(name, "/\x00"):
		return linux.EINVAL
	}
	return nil
}

// errno converts a host error to the exact Linux errno for the guest (the
// p9 server would otherwise fold e.g. ENOTEMPTY into EEXIST).
func errno(err error) error {
	if err == nil {
		return nil
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return linux.Errno(e)
	}
	return err
}

// qidType maps a host mode to a QID type.
func qidType(mode uint32) p9.QIDType {
	return p9.FileMode(mode).QIDType()
}

// qidDevMix spreads a device number over the QID path bits.
const qidDevMix = 0x9E3779B97F4A7C15

// qidFor derives a QID from a host stat. Path mixes the device into the
// inode number so that exports on different file systems rarely collide.
func qidFor(st *unix.Stat_t) p9.QID {
	return p9.QID{
		Type: qidType(st.Mode),
		Path: st.Ino ^ (st.Dev * qidDevMix),
	}
}

// attrFor converts a host stat to the requested attributes.
func attrFor(st *unix.Stat_t, req p9.AttrMask) (p9.AttrMask, p9.Attr) {
	attr := p9.Attr{
		Mode:             p9.FileMode(st.Mode),
		UID:              p9.UID(st.Uid),
		GID:              p9.GID(st.Gid),
		NLink:            p9.NLink(st.Nlink),
		RDev:             p9.Dev(st.Rdev),
		Size:             uint64(st.Size),
		BlockSize:        uint64(st.Blksize),
		Blocks:           uint64(st.Blocks),
		ATimeSeconds:     uint64(st.Atim.Sec),
		ATimeNanoSeconds: uint64(st.Atim.Nsec),
		MTimeSeconds:     uint64(st.Mtim.Sec),
		MTimeNanoSeconds: uint64(st.Mtim.Nsec),
		CTimeSeconds:     uint64(st.Ctim.Sec),
		CTimeNanoSeconds: uint64(st.Ctim.Nsec),
	}
	valid := p9.AttrMask{
		Mode: true, NLink: true, UID: true, GID: true, RDev: true,
		ATime: true, MTime: true, CTime: true, INo: true, Size: true, Blocks: true,
	}
	_ = req // we always have the basic set; returning more than asked is allowed
	return valid, attr
}
