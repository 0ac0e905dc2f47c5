package arm64smoke

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

func TestARM64Smoke(t *testing.T) {
	if os.Getenv(InsideEnv) != "1" {
		t.Skipf("runs inside the nested arm64 harness (testharness/nested TestNestedARM64Smoke sets %s)", InsideEnv)
	}
	require.Equal(t, "arm64", runtime.GOARCH)

	info, err := os.Stat(kvm.DevicePath)
	require.NoError(t, err, "the outer kernel runs KVM at EL2")
	require.NotZero(t, info.Mode()&os.ModeCharDevice, "%s is a character device", kvm.DevicePath)
	sys, err := kvm.OpenPath(kvm.DevicePath)
	require.NoError(t, err)
	defer sys.Close()
	version, err := sys.GetAPIVersion()
	require.NoError(t, err)
	require.Equal(t, 12, version, "KVM_GET_API_VERSION")
	vm, err := sys.CreateVM()
	require.NoError(t, err, "KVM_CREATE_VM")
	require.NoError(t, vm.Close())

	out, err := exec.Command("sh", "-c", "echo ok").CombinedOutput()
	require.NoError(t, err, "busybox sh: %s", out)
	require.Equal(t, "ok\n", string(out))
	for _, tool := range []string{"/bin/sh", "/bin/cat", "/usr/bin/env", "/sbin/ip"} {
		_, err := os.Stat(tool)
		require.NoError(t, err, "busybox applet %s", tool)
	}
	// The userland's packages: what e2e's egress test runs in our guest
	// (over virtio-fs from this root) and the bench's peer VMM, with their
	// libraries through the merged-/usr links.
	for _, cmd := range [][]string{{"/usr/bin/curl", "--version"}, {"qemu-system-aarch64", "--version"}} {
		out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
		require.NoError(t, err, "%v: %s", cmd, out)
		t.Logf("%v: %s", cmd, strings.SplitN(string(out), "\n", 2)[0])
	}
	_, err = os.Stat("/lib/ld-linux-aarch64.so.1")
	require.NoError(t, err, "the dynamic loader at its ABI path")
	_, err = os.Stat("/etc/ssl/certs/ca-certificates.crt")
	require.NoError(t, err, "curl's CA bundle")
	_, err = os.ReadDir("/sys/kernel/debug/kvm")
	require.NoError(t, err, "debugfs with KVM's counters")
	out, err = exec.Command("sh", "-c", "echo w > /usr/bin/written && cat /usr/bin/written").CombinedOutput()
	require.NoError(t, err, "the shared userland takes writes in its overlay: %s", out)

	passwd, err := os.ReadFile("/etc/passwd")
	require.NoError(t, err)
	require.Contains(t, string(passwd), "root:x:0:0:")

	// The tests run in their source directory, shared read-only from the
	// host, so they find their testdata.
	_, err = os.Stat("doc.go")
	require.NoError(t, err, "the package's source directory is visible")
	require.Error(t, os.WriteFile("written", nil, 0o644), "the shared source is read-only")
}
