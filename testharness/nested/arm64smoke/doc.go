// Package arm64smoke holds the payload of the nested arm64 harness's smoke
// test (testharness/nested's TestNestedARM64Smoke): a test that, inside the
// arm64 outer guest, checks what later arm64 tests rely on there: it runs
// as arm64, /dev/kvm answers (API version 12, a VM can be created) and the
// userland runs: busybox, curl and qemu-system-aarch64 with their
// libraries, writable through its overlay, with debugfs. Anywhere else it
// skips.
package arm64smoke

// InsideEnv is set (to "1") by the nested wrapper: TestARM64Smoke runs
// only where it is, inside the arm64 outer guest, and fails there rather
// than skip when something is missing.
const InsideEnv = "COWORK_VMM_ARM64_SMOKE"
