package machine

import "testing"

// TestKVMSnapshotRestoresALinuxGuestOn2CPUs is
// TestKVMSnapshotRestoresALinuxGuest with a second vCPU, which the guest
// started by PSCI CPU_ON: both vCPUs' registers, their redistributors and
// CPU interfaces are saved and restored (arm64, where the harness runs it
// in seconds).
func TestKVMSnapshotRestoresALinuxGuestOn2CPUs(t *testing.T) {
	snapshotRestoresALinuxGuest(t, 2)
}
