package doctor

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/helper/backend/vm"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// fileSharingCheck says which device the kvm backend shares host
// directories through (COWORK_VMM_FS); a value it does not accept fails
// the check, as it fails the kvm backend's startVM.
func (r *runner) fileSharingCheck() bool {
	c := Check{ID: CheckFileSharing, Group: GroupCoworkVMM, Title: "File sharing (kvm backend)"}
	defer func() { r.add(c) }()
	kind, err := vm.FileSharingKind(r.h.Getenv(vm.FSEnv))
	switch {
	case err != nil:
		c.Status = StatusFail
		c.Detail = err.Error()
		c.Fix = "unset " + vm.FSEnv + " (virtio-fs, the default) or set it to " + vm.FileSharingNineP
		return false
	case kind == protocol.MountKindNineP:
		c.Status = StatusOK
		c.Detail = "virtio-9p devices (" + vm.FSEnv + "=" + vm.FileSharingNineP + "); unset it for virtio-fs, the default"
	default:
		c.Status = StatusOK
		c.Detail = "virtio-fs devices (the default; " + vm.FSEnv + "=" + vm.FileSharingNineP + " selects virtio-9p)"
	}
	return true
}

// fileLimitCheck says whether the open-file limit a helper gets leaves the
// file-sharing devices room: each holds a host descriptor per file the
// guest has looked up (internal/fdlimit).
func (r *runner) fileLimitCheck() {
	c := Check{ID: CheckFileLimit, Group: GroupCoworkVMM, Title: "Open-file limit (file sharing)", Status: StatusOK}
	defer func() { r.add(c) }()
	limit, err := r.h.FileLimit()
	switch {
	case err != nil:
		c.Status = StatusWarn
		c.Detail = "could not read or raise RLIMIT_NOFILE: " + err.Error()
	case limit < fdlimit.Low:
		c.Status = StatusWarn
		c.Detail = fmt.Sprintf("%d descriptors: the guest's file sharing holds one per file it has looked up, so large trees "+
			"(dpkg's database, git status on a big repository) may fail with \"Too many open files\"", limit)
		c.Fix = fmt.Sprintf("raise the hard limit to %d or more: LimitNOFILE= for a systemd service, 'nofile' in /etc/security/limits.conf, or run the helper as root", fdlimit.Low)
	default:
		c.Detail = fmt.Sprintf("%d descriptors for the file-sharing devices", limit)
	}
}

// warmStartCheck says whether the kvm backend starts VMs warm, from its
// snapshot (COWORK_VMM_SNAPSHOT), and what snapshot it holds.
func (r *runner) warmStartCheck() {
	c := Check{ID: CheckWarmStart, Group: GroupCoworkVMM, Title: "Warm starts (kvm backend)", Status: StatusOK}
	defer func() { r.add(c) }()
	dir := vm.SnapshotDirFor(r.h.Getenv)
	if dir == "" {
		c.Detail = "off: every start boots cold (" + vm.SnapshotEnv + "=off, or no cache directory)"
		return
	}
	snaps := vm.Snapshots(dir)
	if len(snaps) == 0 {
		c.Detail = "on, no snapshot yet in " + dir + ": the next start boots cold and takes one; " + vm.SnapshotEnv + "=off turns warm starts off"
		return
	}
	c.Detail = "on: the next start of the same VM (this build, kernel, memory and vCPUs) restores " + strings.Join(snaps, ", ") +
		"; remove it to boot cold once, or set " + vm.SnapshotEnv + "=off"
}

// suspendedCheck lists the profiles' suspended guests (the kvm backend
// saves a guest at stopVM and resumes it at the next startVM): their
// size, age and whether the next start would resume them.
func (r *runner) suspendedCheck() {
	c := Check{ID: CheckSuspended, Group: GroupCoworkVMM, Title: "Suspended guests (kvm backend)", Status: StatusOK}
	defer func() { r.add(c) }()
	if vm.SnapshotDirFor(r.h.Getenv) == "" || r.h.Getenv(vm.SuspendEnv) == "off" {
		c.Detail = "off: stopVM shuts guests down (" + vm.SnapshotEnv + "=off or " + vm.SuspendEnv + "=off, or no cache directory)"
		return
	}
	data, err := r.h.DataDir()
	if err != nil {
		c.Status, c.Detail = StatusSkip, "no data directory: "+err.Error()
		return
	}
	states := vm.SuspendedStates(filepath.Join(data, "profiles"))
	if len(states) == 0 {
		c.Detail = "none: stopVM saves a guest in its profile's directory and the next startVM resumes it; " + vm.SuspendEnv + "=off turns this off"
		return
	}
	var lines []string
	for _, s := range states {
		line := fmt.Sprintf("%s: %.1f MiB", s.Profile, float64(s.Bytes)/(1<<20))
		if !s.SavedAt.IsZero() {
			line += fmt.Sprintf(", saved %s ago", time.Since(s.SavedAt).Round(time.Second))
		}
		if s.Unusable != "" {
			line += ", not resumed: " + s.Unusable
		} else {
			line += ", resumed by its next start (same build, kernel, memory and vCPUs)"
		}
		lines = append(lines, line)
	}
	c.Detail = strings.Join(lines, "; ")
}
