package doctor

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/guest/seccomp"
)

// seccompCheck: the process backend's spawns run under guest/seccomp's
// filter, which the host kernel installs (the VM's kernel is ours and has
// it); a spawn whose filter cannot be installed does not start.
func (r *runner) seccompCheck() bool {
	c := Check{ID: CheckSeccomp, Group: GroupCoworkVMM, Title: "Sandbox syscall filter"}
	defer func() { r.add(c) }()
	if _, err := seccomp.Program(); err != nil {
		c.Status = StatusFail
		c.Detail = err.Error() + ": the process backend's processes cannot be confined, and none would start"
		c.Fix = "use the kvm backend on this architecture"
		return false
	}
	if err := r.h.ProbeSeccomp(); err != nil {
		c.Status = StatusFail
		c.Detail = "the kernel cannot install the sandbox's seccomp filter (" + err.Error() + "): no process of the process backend would start"
		c.Fix = "run a kernel with CONFIG_SECCOMP_FILTER (every distribution kernel has it), or use the kvm backend"
		return false
	}
	c.Status = StatusOK
	c.Detail = "seccomp filter mode available; every sandboxed process runs with " + seccomp.Summary()
	if n := r.ownSeccompFilters(); n > 0 {
		c.Detail += fmt.Sprintf(" (doctor itself already runs under %d filter(s), a container's or a sandbox's: ours stacks on them, and theirs may refuse more)", n)
	}
	return true
}

// ownSeccompFilters reads Seccomp_filters from /proc/self/status (Linux
// 5.10): how many filters this process runs under; 0 when unknown.
func (r *runner) ownSeccompFilters() int {
	b, err := r.h.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Seccomp_filters:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
