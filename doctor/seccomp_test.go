package doctor

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/guest/seccomp"
)

// TestSandboxSeccomp: doctor reports the spawns' filter (what it refuses)
// and whether the kernel can install it; without it the process backend
// is not usable.
func TestSandboxSeccomp(t *testing.T) {
	h := healthyHost()
	r := h.run(t, Options{})
	c := wantStatus(t, r, CheckSeccomp, StatusOK)
	wantContains(t, "detail", c.Detail, "seccomp filter mode available",
		fmt.Sprintf("%d system calls refused", len(seccomp.Denied())), "keyctl", "ioctl TIOCSTI and TIOCLINUX refused")
	wantUsable(t, r, BackendKVM, BackendProcess)

	h.files["/proc/self/status"] = fakeFile{data: []byte("Name:\tcowork-vmm\nSeccomp:\t2\nSeccomp_filters:\t3\n")}
	c = wantStatus(t, h.run(t, Options{}), CheckSeccomp, StatusOK)
	wantContains(t, "detail", c.Detail, "already runs under 3 filter(s)")

	h.seccompErr = errors.New("the kernel has no seccomp filter mode (CONFIG_SECCOMP_FILTER): invalid argument")
	r = h.run(t, Options{Boot: true})
	c = wantStatus(t, r, CheckSeccomp, StatusFail)
	wantContains(t, "detail", c.Detail, "CONFIG_SECCOMP_FILTER", "no process of the process backend would start")
	wantContains(t, "fix", c.Fix, "CONFIG_SECCOMP_FILTER", "kvm backend")
	wantStatus(t, r, CheckBootProcess, StatusSkip)
	wantUsable(t, r, BackendKVM)
}

// TestRealHostSeccomp: this machine's kernel (any a helper runs on) can
// install the filter, and doctor says so.
func TestRealHostSeccomp(t *testing.T) {
	r := &runner{h: RealHost()}
	if !r.seccompCheck() {
		t.Fatalf("seccomp check failed here: %+v", r.checks)
	}
	t.Logf("%s: %s", r.checks[0].Title, r.checks[0].Detail)
}
