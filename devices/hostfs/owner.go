package hostfs

import "golang.org/x/sys/unix"

// Owner is a uid and a gid as the guest sees them.
type Owner struct{ UID, GID uint32 }

// Option changes how an export is served (Add, AddFile).
type Option func(*export)

// ShowOwnedAs makes the export show what the helper owns as owner's: a
// file whose host uid is the helper's effective uid is reported with
// owner.UID, and one whose gid is the helper's effective gid with
// owner.GID; every other owner is reported as the host has it. A change
// of owner to owner.UID or owner.GID is taken as one to the helper's own
// ids (nothing changes on the host).
//
// The guest gives each session a uid of its own, and its kernel checks a
// file's permission bits against the owner the device reports. Reported
// as the helper's, a session's own files were "other" to its processes,
// which reached them through capabilities that access(2) ignores for a
// non-root uid: git refused the session's directory ("Cannot access work
// tree"). What the host enforces is unchanged: every operation still runs
// as the helper.
func ShowOwnedAs(owner Owner) Option {
	return func(ex *export) {
		ex.shownAs = &owner
		ex.hostUID, ex.hostGID = uint32(unix.Geteuid()), uint32(unix.Getegid())
	}
}

// showOwner rewrites st's owner as the export shows it (ShowOwnedAs).
func (e *export) showOwner(st *unix.Stat_t) {
	if e.shownAs == nil {
		return
	}
	if st.Uid == e.hostUID {
		st.Uid = e.shownAs.UID
	}
	if st.Gid == e.hostGID {
		st.Gid = e.shownAs.GID
	}
}

// hostOwner turns a change of owner to the ids the export shows for the
// helper's (ShowOwnedAs) back into one to the helper's own.
func (e *export) hostOwner(attr SetAttr) SetAttr {
	if e.shownAs == nil {
		return attr
	}
	if attr.Valid&SetUID != 0 && attr.UID == e.shownAs.UID {
		attr.UID = e.hostUID
	}
	if attr.Valid&SetGID != 0 && attr.GID == e.shownAs.GID {
		attr.GID = e.hostGID
	}
	return attr
}
