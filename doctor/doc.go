// Package doctor is `cowork-vmm doctor`: it checks what this host can run
// and says, for each finding, what a user can do about it.
//
// It owns the checks (KVM device, access, API and capabilities, whether this
// KVM can boot Linux at all, the guest kernel and its version, the socket's
// runtime directory, user namespaces and the spawns' seccomp filter for the
// process backend, free disk for sessions, the profiles' root disks and
// which userland each profile's guest uses (the client's bundle image or
// the host's directories, userland.go), an
// optional trial boot), the separate
// view of what Claude Desktop's support gate checks before it starts any
// helper, the verdict (which backends work, exit status) and the two
// renderings: aligned text for a terminal and JSON with stable field names.
// It also resets a profile's root disk (--reset-root, resetroot.go).
//
// Every host probe goes through Host, a struct of functions, so tests run
// the checks against faked hosts; Host.Arch is the machine's GOARCH, which
// picks the KVM facts (x86: PVM and the trial guest; arm64: preferred
// target, GICv3 or GICv2, PSCI 0.2) and the gate's qemu and firmware (x86:
// qemu-system-x86_64 and OVMF; arm64: qemu-system-aarch64 and AAVMF), so
// tests run either on any machine. The KVM probe is kvm.ProbeHost, the one
// answer to "can this KVM boot Linux?" that the kvm backend's preflight and
// the tests use too; the kernel locations are guest/kernel and
// guest/kernel/embedded, the data directory helper.DefaultDataDir, and the
// trial boot the helper/backend/vm and helper/backend/process backends themselves.
package doctor
