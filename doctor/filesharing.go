package doctor

import (
	"strings"

	kvmbackend "github.com/cowork-vmm/cowork-vmm/helper/backend/kvm"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// fileSharingCheck says which device the kvm backend shares host
// directories through (COWORK_VMM_FS); a value it does not accept fails
// the check, as it fails the kvm backend's startVM.
func (r *runner) fileSharingCheck() bool {
	c := Check{ID: CheckFileSharing, Group: GroupCoworkVMM, Title: "File sharing (kvm backend)"}
	defer func() { r.add(c) }()
	kind, err := kvmbackend.FileSharingKind(r.h.Getenv(kvmbackend.FSEnv))
	switch {
	case err != nil:
		c.Status = StatusFail
		c.Detail = err.Error()
		c.Fix = "unset " + kvmbackend.FSEnv + " (virtio-fs, the default) or set it to " + kvmbackend.FileSharingNineP
		return false
	case kind == protocol.MountKindNineP:
		c.Status = StatusOK
		c.Detail = "virtio-9p devices (" + kvmbackend.FSEnv + "=" + kvmbackend.FileSharingNineP + "); unset it for virtio-fs, the default"
	default:
		c.Status = StatusOK
		c.Detail = "virtio-fs devices (the default; " + kvmbackend.FSEnv + "=" + kvmbackend.FileSharingNineP + " selects virtio-9p)"
	}
	return true
}

// warmStartCheck says whether the kvm backend starts VMs warm, from its
// snapshot (COWORK_VMM_SNAPSHOT), and what snapshot it holds.
func (r *runner) warmStartCheck() {
	c := Check{ID: CheckWarmStart, Group: GroupCoworkVMM, Title: "Warm starts (kvm backend)", Status: StatusOK}
	defer func() { r.add(c) }()
	dir := kvmbackend.SnapshotDirFor(r.h.Getenv)
	if dir == "" {
		c.Detail = "off: every start boots cold (" + kvmbackend.SnapshotEnv + "=off, or no cache directory)"
		return
	}
	snaps := kvmbackend.Snapshots(dir)
	if len(snaps) == 0 {
		c.Detail = "on, no snapshot yet in " + dir + ": the next start boots cold and takes one; " + kvmbackend.SnapshotEnv + "=off turns warm starts off"
		return
	}
	c.Detail = "on: the next start of the same VM (this build, kernel, memory and vCPUs) restores " + strings.Join(snaps, ", ") +
		"; remove it to boot cold once, or set " + kvmbackend.SnapshotEnv + "=off"
}
