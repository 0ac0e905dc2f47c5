package nested

import (
	"testing"
	"time"
)

// arm64UnitPackages are the packages whose unit tests run in the arm64
// harness (TestNestedARM64Units): those whose code differs by
// architecture or talks to the kernel in ways that do (KVM's arm64 API,
// the arm64 layout and device tree, seccomp's audit arch and syscall
// numbers, the agent's mounts and namespaces, the process backend's
// sandbox, doctor's view of an arm64 host).
var arm64UnitPackages = []string{
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm",
	"github.com/cowork-vmm/cowork-vmm/vmm/arm64",
	"github.com/cowork-vmm/cowork-vmm/vmm",
	"github.com/cowork-vmm/cowork-vmm/machine",
	"github.com/cowork-vmm/cowork-vmm/guest/seccomp",
	"github.com/cowork-vmm/cowork-vmm/guest/agent",
	"github.com/cowork-vmm/cowork-vmm/helper/backend/process",
	"github.com/cowork-vmm/cowork-vmm/doctor",
}

// TestNestedARM64Units runs the unit tests of arm64UnitPackages, built for
// arm64, inside the arm64 harness (-short: their own nested wrappers skip
// there anyway), and fails if any fails there. It skips where the arm64
// harness is unavailable.
func TestNestedARM64Units(t *testing.T) {
	RequireARM64Harness(t)
	RunGoTests(t, ArchARM64, arm64UnitPackages, 20*time.Minute, "-test.short")
}
