package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
)

// Sysctls that switch unprivileged user namespaces off.
const (
	sysctlUsernsClone     = "/proc/sys/kernel/unprivileged_userns_clone" // Debian/Ubuntu patch
	sysctlMaxUserNS       = "/proc/sys/user/max_user_namespaces"
	sysctlAppArmorUserNS  = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns" // Ubuntu 23.10+
	sysctlPersistFileHint = "/etc/sysctl.d/60-cowork-vmm.conf"
)

// Disk thresholds for session data.
const (
	diskWarnBytes = 2 << 30
	diskFailBytes = 256 << 20
)

// userCheck warns when doctor runs as root: the client runs as the user,
// and what root may do (open /dev/kvm, make namespaces) says nothing about
// what that user may.
func (r *runner) userCheck() {
	c := Check{ID: CheckUser, Group: GroupCoworkVMM, Title: "User"}
	uid := r.h.Getuid()
	if uid == 0 {
		c.Status = StatusWarn
		c.Detail = "doctor runs as root; Claude Desktop runs as your login user, whose access can differ"
		c.Fix = "run `cowork-vmm doctor` as the user who runs Claude Desktop"
	} else {
		c.Status = StatusOK
		c.Detail = fmt.Sprintf("uid %d", uid)
	}
	r.add(c)
}

// readSysctl returns the trimmed value and whether the file exists.
func (r *runner) readSysctl(path string) (string, bool) {
	b, err := r.h.ReadFile(path)
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// userNSCheck: the process backend runs the agent in new user, mount, PID,
// UTS and IPC namespaces.
func (r *runner) userNSCheck() bool {
	c := Check{ID: CheckUserNS, Group: GroupCoworkVMM, Title: "User namespaces"}
	defer func() { r.add(c) }()

	var blockers, fixes []string
	if v, ok := r.readSysctl(sysctlUsernsClone); ok && v == "0" {
		blockers = append(blockers, "kernel.unprivileged_userns_clone=0")
		fixes = append(fixes, fmt.Sprintf("sudo sysctl -w kernel.unprivileged_userns_clone=1 (keep it: echo kernel.unprivileged_userns_clone=1 | sudo tee -a %s)", sysctlPersistFileHint))
	}
	if v, ok := r.readSysctl(sysctlMaxUserNS); ok && v == "0" {
		blockers = append(blockers, "user.max_user_namespaces=0")
		fixes = append(fixes, fmt.Sprintf("sudo sysctl -w user.max_user_namespaces=15000 (keep it: echo user.max_user_namespaces=15000 | sudo tee -a %s)", sysctlPersistFileHint))
	}
	appArmor := false
	if v, ok := r.readSysctl(sysctlAppArmorUserNS); ok && v == "1" {
		appArmor = true
	}
	exe, _ := r.h.Executable()
	if exe == "" {
		exe = "/usr/local/bin/cowork-vmm"
	}
	appArmorFix := fmt.Sprintf("allow cowork-vmm user namespaces with an AppArmor profile: printf 'abi <abi/4.0>,\\ninclude <tunables/global>\\nprofile cowork-vmm %s flags=(unconfined) {\\n  userns,\\n}\\n' | sudo tee /etc/apparmor.d/cowork-vmm && sudo apparmor_parser -r /etc/apparmor.d/cowork-vmm", exe)

	err := r.h.ProbeUserNS(r.ctx)
	switch {
	case err != nil:
		c.Status = StatusFail
		c.Detail = "the process backend cannot create its namespaces: " + err.Error()
		if len(blockers) > 0 {
			c.Detail += " (" + strings.Join(blockers, ", ") + ")"
		}
		if appArmor {
			fixes = append(fixes, appArmorFix)
		}
		if r.chrooted() {
			c.Detail += " (this process runs in a chroot, where the kernel refuses new user namespaces)"
			fixes = append(fixes, "run cowork-vmm outside the chroot (a container or mount namespace instead of chroot works)")
		}
		if len(fixes) == 0 {
			fixes = append(fixes, "check that the kernel has CONFIG_USER_NS and that no container or seccomp policy forbids unshare(CLONE_NEWUSER)")
		}
		c.Fix = strings.Join(fixes, "; ")
		return false
	case appArmor:
		c.Status = StatusWarn
		c.Detail = "a user namespace starts, but AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1): the agent may be denied mounts inside it"
		c.Fix = appArmorFix
	default:
		c.Status = StatusOK
		c.Detail = "user, mount, PID, UTS and IPC namespaces start (process backend)"
	}
	if r.h.Getuid() == 0 {
		c.Detail += "; as root, which proves nothing for an unprivileged user"
	}
	return true
}

// chrooted reports whether our root differs from PID 1's (readable only
// by root; false when it cannot tell).
func (r *runner) chrooted() bool {
	ours, err1 := r.h.Stat("/")
	pid1, err2 := r.h.Stat("/proc/1/root")
	if err1 != nil || err2 != nil {
		return false
	}
	a, ok1 := ours.Sys().(*syscall.Stat_t)
	b, ok2 := pid1.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && (a.Dev != b.Dev || a.Ino != b.Ino)
}

// diskCheck looks at the free space where sessions live.
func (r *runner) diskCheck() {
	c := Check{ID: CheckDisk, Group: GroupCoworkVMM, Title: "Disk for sessions"}
	defer func() { r.add(c) }()
	dir, err := r.h.DataDir()
	if err != nil {
		c.Status = StatusFail
		c.Detail = err.Error()
		c.Fix = "set XDG_DATA_HOME (or HOME) to a directory of yours"
		return
	}
	// The data directory may not exist yet: measure its nearest ancestor.
	at := dir
	for {
		if _, err := r.h.Stat(at); err == nil || !errors.Is(err, fs.ErrNotExist) {
			break
		}
		parent := filepath.Dir(at)
		if parent == at {
			break
		}
		at = parent
	}
	free, err := r.h.FreeBytes(at)
	if err != nil {
		c.Status = StatusWarn
		c.Detail = fmt.Sprintf("cannot measure free space for %s: %v", dir, err)
		return
	}
	c.Detail = fmt.Sprintf("%s free for %s", humanBytes(free), dir)
	switch {
	case free < diskFailBytes:
		c.Status = StatusFail
		c.Fix = fmt.Sprintf("free space on the filesystem holding %s, or set XDG_DATA_HOME to a larger disk (sessions keep their files under $XDG_DATA_HOME/cowork-vmm)", at)
	case free < diskWarnBytes:
		c.Status = StatusWarn
		c.Fix = fmt.Sprintf("sessions may run out of space below %s: free space on the filesystem holding %s, or set XDG_DATA_HOME to a larger disk", humanBytes(diskWarnBytes), at)
	default:
		c.Status = StatusOK
	}
}

func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}
