package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel/embedded"
	"github.com/cowork-vmm/cowork-vmm/vmm/kvm"
)

// fakeFile is one path of a fake host.
type fakeFile struct {
	mode fs.FileMode
	uid  int
	gid  int
	ino  uint64
	data []byte
	// noAccess makes access(2) fail with EACCES.
	noAccess bool
}

type fakeInfo struct {
	name string
	f    fakeFile
}

func (i fakeInfo) Name() string       { return i.name }
func (i fakeInfo) Size() int64        { return int64(len(i.f.data)) }
func (i fakeInfo) Mode() fs.FileMode  { return i.f.mode }
func (i fakeInfo) ModTime() time.Time { return time.Time{} }
func (i fakeInfo) IsDir() bool        { return i.f.mode.IsDir() }
func (i fakeInfo) Sys() any {
	return &syscall.Stat_t{Uid: uint32(i.f.uid), Gid: uint32(i.f.gid), Ino: i.f.ino}
}

// fakeHost is a host made of a file map and canned probe answers. The zero
// value of each answer is "works".
type fakeHost struct {
	// arch is the host's GOARCH: "amd64" unless a test says otherwise,
	// whatever machine runs the tests.
	arch      string
	uid       int
	groups    []int
	env       map[string]string
	files     map[string]fakeFile
	path      map[string]string // LookPath answers
	free      uint64
	pvm       bool
	pvmWhy    string
	kvm       kvm.HostProbe
	usernsErr error
	// seccompErr is ProbeSeccomp's answer.
	seccompErr error
	embedded   []byte
	cache      string // KernelCache answer; "" = none built
	exe        string
	rootDisks  []RootDisk // RootDisks answer
	fileLimit  uint64     // FileLimit answer; 0 = 1<<20

	mu    sync.Mutex
	boots []string
	// bootBudget is the time the last trial boot was given.
	bootBudget time.Duration
	boot       map[string]error
}

const testUID = 1000

// healthyHost is a laptop where everything works: hardware KVM, a built
// kernel, a logind runtime dir, user namespaces, plenty of disk, and the
// client's gate tools installed.
func healthyHost() *fakeHost {
	caps := map[string]bool{}
	for _, c := range kvm.RequiredCapabilitiesFor("amd64") {
		caps[c.String()] = true
	}
	return &fakeHost{
		arch: "amd64",
		uid:  testUID,
		env:  map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000", "HOME": "/home/u"},
		files: map[string]fakeFile{
			"/dev/kvm":                        {mode: fs.ModeDevice | fs.ModeCharDevice | 0o660},
			"/dev/vhost-vsock":                {mode: fs.ModeDevice | fs.ModeCharDevice | 0o660},
			"/proc/cpuinfo":                   {mode: 0o444, data: []byte("processor\t: 0\nflags\t\t: fpu vme sse2 vmx x2apic\n")},
			"/run/user/1000":                  {mode: fs.ModeDir | 0o700, uid: testUID},
			"/home/u/.cache/k/vmlinux":        {mode: 0o644, data: append(bytes.Repeat([]byte{0}, 5000), []byte("Linux version 6.1.99-cowork (b@h) (gcc) #1 SMP\n\x00")...)},
			"/usr/share/OVMF/OVMF_CODE_4M.fd": {mode: 0o644},
			"/usr/share/OVMF/OVMF_VARS_4M.fd": {mode: 0o644},
			"/usr/libexec/virtiofsd":          {mode: 0o755},
			"/usr/local/bin/cowork-vmm":       {mode: 0o755, data: []byte("cowork-vmm binary")},
			"/home/u/.local/share":            {mode: fs.ModeDir | 0o700, uid: testUID},
			ClientHelperPath:                  {mode: 0o755, data: []byte("cowork-vmm binary")},
		},
		path:  map[string]string{"qemu-system-x86_64": "/usr/bin/qemu-system-x86_64"},
		free:  50 << 30,
		kvm:   kvm.HostProbe{APIVersion: kvm.APIVersion, Capabilities: caps, Tried: true},
		cache: "/home/u/.cache/k/vmlinux",
		exe:   "/usr/local/bin/cowork-vmm",
		boot:  map[string]error{},
	}
}

func notExist(p string) error { return &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist} }

func (f *fakeHost) stat(p string) (fs.FileInfo, error) {
	file, ok := f.files[p]
	if !ok {
		return nil, notExist(p)
	}
	return fakeInfo{name: filepath.Base(p), f: file}, nil
}

func (f *fakeHost) host() *Host {
	return &Host{
		Arch:   f.arch,
		Getenv: func(k string) string { return f.env[k] },
		FileLimit: func() (uint64, error) {
			if f.fileLimit == 0 {
				return 1 << 20, nil
			}
			return f.fileLimit, nil
		},
		Getuid: func() int { return f.uid },
		Getgid: func() int { return f.uid },
		Getgroups: func() ([]int, error) {
			return f.groups, nil
		},
		Stat:  f.stat,
		Lstat: f.stat,
		ReadFile: func(p string) ([]byte, error) {
			file, ok := f.files[p]
			if !ok {
				return nil, notExist(p)
			}
			return file.data, nil
		},
		Open: func(p string) (io.ReadCloser, error) {
			file, ok := f.files[p]
			if !ok {
				return nil, notExist(p)
			}
			return io.NopCloser(bytes.NewReader(file.data)), nil
		},
		Access: func(p string, mode uint32) error {
			file, ok := f.files[p]
			if !ok {
				return notExist(p)
			}
			if file.noAccess {
				return syscall.EACCES
			}
			return nil
		},
		LookPath: func(name string) (string, error) {
			if p, ok := f.path[name]; ok {
				return p, nil
			}
			return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
		},
		FreeBytes:  func(string) (uint64, error) { return f.free, nil },
		Executable: func() (string, error) { return f.exe, nil },
		DataDir:    func() (string, error) { return "/home/u/.local/share/cowork-vmm", nil },
		RootDisks:  func(string) ([]RootDisk, error) { return f.rootDisks, nil },
		KernelCache: func() (string, error) {
			if f.cache == "" {
				return "", errors.New("no guest kernel built: run `make kernel`")
			}
			return f.cache, nil
		},
		EmbeddedKernel: func() ([]byte, error) {
			if f.embedded == nil {
				return nil, embedded.ErrNotEmbedded
			}
			return f.embedded, nil
		},
		ProbeKVM:     f.probeKVM,
		ProbeUserNS:  func(context.Context) error { return f.usernsErr },
		ProbeSeccomp: func() error { return f.seccompErr },
		TrialBoot: func(ctx context.Context, backend string) (BootResult, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.boots = append(f.boots, backend)
			if dl, ok := ctx.Deadline(); ok {
				f.bootBudget = time.Until(dl)
			}
			if err := f.boot[backend]; err != nil {
				return BootResult{}, err
			}
			return BootResult{Elapsed: 1250 * time.Millisecond, Kernel: "6.1.99-cowork"}, nil
		},
		BuildInfo: func(p string) (string, string, error) {
			if p == f.exe {
				return ModulePath, "v0.1.0", nil
			}
			file, ok := f.files[p]
			if ok && bytes.HasPrefix(file.data, []byte("cowork-vmm")) {
				return ModulePath, "v0.0.9", nil
			}
			return "", "", errors.New("not a Go binary")
		},
	}
}

func (f *fakeHost) run(t *testing.T, opts Options) Report {
	t.Helper()
	opts.Host = f.host()
	return Run(context.Background(), opts)
}

// check returns the check with id or fails the test.
func check(t *testing.T, r Report, id string) Check {
	t.Helper()
	c, ok := r.Check(id)
	if !ok {
		t.Fatalf("no %s check in the report", id)
	}
	return c
}

func wantStatus(t *testing.T, r Report, id string, want Status) Check {
	t.Helper()
	c := check(t, r, id)
	if c.Status != want {
		t.Errorf("%s: status %s, want %s (detail: %s; fix: %s)", id, c.Status, want, c.Detail, c.Fix)
	}
	return c
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("%s %q does not mention %q", what, got, w)
		}
	}
}

func wantUsable(t *testing.T, r Report, want ...string) {
	t.Helper()
	got := strings.Join(r.Verdict.UsableBackends, ",")
	if got != strings.Join(want, ",") {
		t.Errorf("usable backends %q, want %q (summary: %s)", got, strings.Join(want, ","), r.Verdict.Summary)
	}
}

// probeKVM is the canned probe: f.kvm with f.pvm's marks, and on a usable
// PVM the trial guest's failure, as kvm.ProbeHost finds them there.
func (f *fakeHost) probeKVM(string) kvm.HostProbe {
	p := f.kvm
	p.Device = kvm.DevicePath
	p.Arch = f.arch
	p.PVM, p.PVMReason = f.pvm, f.pvmWhy
	if f.pvm && p.Usable() == nil {
		p.Tried, p.TrialErr = true, errors.New("its instruction emulator cannot execute int3 in protected mode")
	}
	return p
}
