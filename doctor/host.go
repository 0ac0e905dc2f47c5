package doctor

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel/embedded"
	"github.com/cowork-vmm/cowork-vmm/guest/seccomp"
	"github.com/cowork-vmm/cowork-vmm/helper"
	"github.com/cowork-vmm/cowork-vmm/internal/fdlimit"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// Host is every probe doctor makes of the machine, as functions so that
// tests can fake a host: no /dev/kvm, no permission, PVM, a world-writable
// runtime directory, no kernel, no user namespaces. RealHost probes this
// machine; a nil field is filled from RealHost.
type Host struct {
	// Arch is the GOARCH of the machine (runtime.GOARCH when empty): it
	// decides the KVM facts reported and the client gate's qemu and
	// firmware.
	Arch   string
	Getenv func(key string) string
	Getuid func() int
	Getgid func() int
	// Getgroups is this process's supplementary groups.
	Getgroups func() ([]int, error)
	// Stat follows symlinks; Lstat does not. Ownership is read from
	// FileInfo.Sys() as a *syscall.Stat_t.
	Stat  func(path string) (fs.FileInfo, error)
	Lstat func(path string) (fs.FileInfo, error)
	// ReadFile reads small files (/proc, /sys).
	ReadFile func(path string) ([]byte, error)
	// Open reads large files as a stream (kernel images, binaries).
	Open func(path string) (io.ReadCloser, error)
	// Access is access(2): mode is a mask of unix.R_OK, unix.W_OK, unix.X_OK.
	Access   func(path string, mode uint32) error
	LookPath func(file string) (string, error)
	// FreeBytes is the space available to an unprivileged user on the
	// filesystem holding path (statfs f_bavail × f_bsize).
	FreeBytes  func(path string) (uint64, error)
	Executable func() (string, error)
	// DataDir is the helper's data directory (helper.DefaultDataDir).
	DataDir func() (string, error)
	// RootDisks lists the profiles' root disks in the data directory
	// dataDir, each with whether a VM uses it now (ListRootDisks).
	RootDisks func(dataDir string) ([]RootDisk, error)
	// Userlands says which userland each profile's kvm guest will use
	// (ListUserlands).
	Userlands func(dataDir string) ([]Userland, error)
	// KernelCache is the path of the latest `make kernel` guest vmlinux
	// (kernel.FindGuest for this binary's GOARCH); its error says how to build one.
	KernelCache func() (string, error)
	// EmbeddedKernel is the kernel compiled into this binary
	// (embedded.Kernel); embedded.ErrNotEmbedded when there is none.
	EmbeddedKernel func() ([]byte, error)
	// ProbeKVM is the one answer to "can this host's KVM boot Linux?" and
	// the facts behind it (kvm.ProbeHost on the device at path).
	ProbeKVM func(path string) kvm.HostProbe
	// ProbeUserNS starts a short-lived child in the namespaces the process
	// backend uses; nil means it worked.
	ProbeUserNS func(ctx context.Context) error
	// ProbeSeccomp says whether the kernel can install the sandbox's
	// seccomp filter (seccomp.Supported); nil means it can.
	ProbeSeccomp func() error
	// TrialBoot starts a guest on backend ("kvm" or "process"), waits for
	// its agent's hello and stops it.
	TrialBoot func(ctx context.Context, backend string) (BootResult, error)
	// FileLimit is the open-file limit a helper started like this process
	// gets once it has raised it (fdlimit.Raise).
	FileLimit func() (uint64, error)
	// BuildInfo reads the Go module path and version embedded in the
	// binary at path (debug/buildinfo), without running it.
	BuildInfo func(path string) (modulePath, version string, err error)
}

// BootResult is a trial boot's outcome.
type BootResult struct {
	// Elapsed runs from Start to the agent's hello.
	Elapsed time.Duration
	// Kernel is the guest's kernel release as the agent reported it.
	Kernel string
	// Memory is the guest's memory as its balloon's statistics give it
	// ("" without a balloon or statistics).
	Memory string
}

// RealHost probes this machine.
func RealHost() Host {
	return Host{
		Arch:           runtime.GOARCH,
		Getenv:         os.Getenv,
		Getuid:         os.Getuid,
		Getgid:         os.Getgid,
		Getgroups:      os.Getgroups,
		Stat:           os.Stat,
		Lstat:          os.Lstat,
		ReadFile:       os.ReadFile,
		Open:           func(p string) (io.ReadCloser, error) { return os.Open(p) },
		Access:         unix.Access,
		LookPath:       exec.LookPath,
		FreeBytes:      freeBytes,
		Executable:     os.Executable,
		DataDir:        helper.DefaultDataDir,
		RootDisks:      ListRootDisks,
		Userlands:      ListUserlands,
		KernelCache:    func() (string, error) { return kernel.FindGuest(runtime.GOARCH) },
		EmbeddedKernel: embedded.Kernel,
		ProbeKVM:       kvm.ProbeHost,
		ProbeUserNS:    probeUserNS,
		ProbeSeccomp:   seccomp.Supported,
		TrialBoot:      trialBoot,
		BuildInfo:      readBuildInfo,
		FileLimit:      fdlimit.Raise,
	}
}

// withDefaults fills h's nil fields from RealHost.
func (h Host) withDefaults() Host {
	r := RealHost()
	if h.Arch == "" {
		h.Arch = r.Arch
	}
	if h.Getenv == nil {
		h.Getenv = r.Getenv
	}
	if h.FileLimit == nil {
		h.FileLimit = r.FileLimit
	}
	if h.Getuid == nil {
		h.Getuid = r.Getuid
	}
	if h.Getgid == nil {
		h.Getgid = r.Getgid
	}
	if h.Getgroups == nil {
		h.Getgroups = r.Getgroups
	}
	if h.Stat == nil {
		h.Stat = r.Stat
	}
	if h.Lstat == nil {
		h.Lstat = r.Lstat
	}
	if h.ReadFile == nil {
		h.ReadFile = r.ReadFile
	}
	if h.Open == nil {
		h.Open = r.Open
	}
	if h.Access == nil {
		h.Access = r.Access
	}
	if h.LookPath == nil {
		h.LookPath = r.LookPath
	}
	if h.FreeBytes == nil {
		h.FreeBytes = r.FreeBytes
	}
	if h.Executable == nil {
		h.Executable = r.Executable
	}
	if h.DataDir == nil {
		h.DataDir = r.DataDir
	}
	if h.RootDisks == nil {
		h.RootDisks = r.RootDisks
	}
	if h.Userlands == nil {
		h.Userlands = r.Userlands
	}
	if h.KernelCache == nil {
		h.KernelCache = r.KernelCache
	}
	if h.EmbeddedKernel == nil {
		h.EmbeddedKernel = r.EmbeddedKernel
	}
	if h.ProbeKVM == nil {
		h.ProbeKVM = r.ProbeKVM
	}
	if h.ProbeUserNS == nil {
		h.ProbeUserNS = r.ProbeUserNS
	}
	if h.ProbeSeccomp == nil {
		h.ProbeSeccomp = r.ProbeSeccomp
	}
	if h.TrialBoot == nil {
		h.TrialBoot = r.TrialBoot
	}
	if h.BuildInfo == nil {
		h.BuildInfo = r.BuildInfo
	}
	return h
}

func freeBytes(path string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// userNSProbeTimeout bounds the user-namespace probe's child.
const userNSProbeTimeout = 10 * time.Second

// probeUserNS runs /bin/true in the namespaces the process backend creates
// (user, mount, PID, UTS, IPC), with our uid and gid mapped to root the same
// way, so a failure here is the failure the backend would meet.
func probeUserNS(ctx context.Context) error {
	trueBin := "/bin/true"
	if _, err := os.Stat(trueBin); err != nil {
		trueBin = "/usr/bin/true"
	}
	ctx, cancel := context.WithTimeout(ctx, userNSProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, trueBin)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
		Pdeathsig:                  unix.SIGKILL,
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("starting %s in new user/mount/PID/UTS/IPC namespaces: %w", trueBin, err)
	}
	return nil
}

func readBuildInfo(path string) (string, string, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	return bi.Main.Path, bi.Main.Version, nil
}
