package doctor

import (
	"context"
	"strings"
	"time"
)

// Options configure Run.
type Options struct {
	// Host is probed; nil means RealHost(), and nil fields of a given Host
	// are filled from RealHost().
	Host *Host
	// Boot adds trial boots (--boot) of each backend that passed its checks.
	Boot bool
	// BootTimeout bounds each trial boot (default DefaultBootTimeout).
	BootTimeout time.Duration
	// ClientHelperPath overrides where Claude Desktop's helper is looked
	// for (default ClientHelperPath).
	ClientHelperPath string
}

// runner carries one doctor run.
type runner struct {
	ctx    context.Context
	h      Host
	opts   Options
	checks []Check
}

func (r *runner) add(c Check) { r.checks = append(r.checks, c) }

// Run checks the host and returns the report; it never fails as a whole:
// a probe that cannot run becomes a check that says so.
func Run(ctx context.Context, opts Options) Report {
	h := RealHost()
	if opts.Host != nil {
		h = opts.Host.withDefaults()
	}
	r := &runner{ctx: ctx, h: h, opts: opts}

	r.userCheck()
	kvmFacts := r.kvmChecks()
	kernelOK := r.kernelCheck()
	fileSharingOK := r.fileSharingCheck()
	r.warmStartCheck()
	r.suspendedCheck()
	r.fileLimitCheck()
	serveOK := r.socketChecks()
	usernsOK := r.userNSCheck()
	seccompOK := r.seccompCheck()
	r.diskCheck()
	r.rootDiskCheck()
	r.userlandCheck()
	kvmReady := kvmFacts.works() && kernelOK && fileSharingOK
	kvmBooted, processBooted := r.bootChecks(kvmReady, usernsOK && seccompOK)
	gatePasses, gate := r.clientChecks()

	kvmWorks := kvmReady && kvmBooted
	processWorks := usernsOK && seccompOK && processBooted
	diskOK := true
	if c, ok := r.find(CheckDisk); ok && c.Status == StatusFail {
		diskOK = false
	}

	v := Verdict{
		DefaultBackend:   h.Getenv("COWORK_VMM_BACKEND"),
		UsableBackends:   []string{},
		HelperCanServe:   serveOK && diskOK,
		ClientGatePasses: gatePasses,
		ClientGate:       gate,
	}
	if v.DefaultBackend == "" {
		v.DefaultBackend = BackendKVM
	}
	if kvmWorks {
		v.UsableBackends = append(v.UsableBackends, BackendKVM)
	}
	if processWorks {
		v.UsableBackends = append(v.UsableBackends, BackendProcess)
	}
	for _, b := range v.UsableBackends {
		if b == v.DefaultBackend {
			v.DefaultBackendWorks = true
		}
	}
	v.Summary = summary(v, kvmFacts)
	return Report{Checks: r.checks, Verdict: v}
}

func (r *runner) find(id string) (Check, bool) {
	for _, c := range r.checks {
		if c.ID == id {
			return c, true
		}
	}
	return Check{}, false
}

// summary says in words which backend will work and what to do.
func summary(v Verdict, kvm kvmFacts) string {
	var s []string
	switch {
	case v.DefaultBackendWorks:
		s = append(s, "the "+v.DefaultBackend+" backend (the one the helper uses) works here")
	case v.DefaultBackend != BackendKVM && v.DefaultBackend != BackendProcess:
		s = append(s, "COWORK_VMM_BACKEND="+v.DefaultBackend+" names no backend (use kvm or process)")
	case v.DefaultBackend == BackendKVM && kvm.pvm:
		s = append(s, "the kvm backend cannot work: this host's KVM is PVM, which cannot boot Linux guests")
	default:
		s = append(s, "the "+v.DefaultBackend+" backend (the one the helper uses) cannot work here: see the failed checks")
	}
	switch {
	case v.DefaultBackendWorks:
	case len(v.UsableBackends) > 0:
		s = append(s, "usable instead: COWORK_VMM_BACKEND="+strings.Join(v.UsableBackends, " or COWORK_VMM_BACKEND="))
	default:
		s = append(s, "no backend works")
	}
	if !v.HelperCanServe {
		s = append(s, "and the helper cannot serve the client until the socket-directory or disk checks pass")
	}
	return strings.Join(s, "; ")
}
