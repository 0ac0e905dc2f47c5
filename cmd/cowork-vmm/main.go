package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/doctor"
	"github.com/cowork-vmm/cowork-vmm/guest/agent"
	"github.com/cowork-vmm/cowork-vmm/guest/kernel/embedded"
)

// Stamped by the Makefile with -ldflags -X.
var (
	version = "dev"
	commit  = "unknown"
)

func main() {
	// PID 1 is the VM's /init — unless it is the process backend's agent,
	// which is PID 1 of its own PID namespace and says so with "agent".
	if os.Getpid() == 1 && (len(os.Args) < 2 || os.Args[1] != "agent") {
		agent.VMMain() // never returns
		return
	}
	if filepath.Base(os.Args[0]) == "sudo" { // the guest tool as sudo
		os.Exit(agent.SudoMain(os.Args[1:], os.Stderr))
	}
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

// dispatch runs the subcommand args name and returns the exit status.
func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "agent":
			return agent.ProcessMain(args[1:])
		case "guest-request":
			return guestRequestMain(args[1:], stdout, stderr)
		case "sudo":
			return agent.SudoMain(args[1:], stderr)
		case "root-exec":
			return agent.RootExecMain(args[1:], stderr)
		case "run":
			return runMain(args[1:], stderr)
		case "client":
			return clientMain(args[1:], stdout, stderr)
		case "doctor":
			return doctor.Main(context.Background(), args[1:], stdout, stderr)
		case "kernel-needed":
			return kernelNeededMain(args[1:], stdout, stderr)
		case "version":
			fmt.Fprintf(stdout, "cowork-vmm %s (commit %s, %s, %s/%s)\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			fmt.Fprintf(stdout, "guest kernel: %s\n", embeddedKernelVersion())
			return 0
		case "help", "-h", "-help", "--help":
			usage(stdout)
			return 0
		}
		if !strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(stderr, "cowork-vmm: unknown subcommand %q\n\n", args[0])
			usage(stderr)
			return 2
		}
	}
	return helperMain(args, stderr)
}

// embeddedKernelVersion describes the guest kernel built into this binary.
func embeddedKernelVersion() string {
	if !embedded.Available() {
		return "not embedded (the kvm backend looks beside the binary and in the build cache; see doctor)"
	}
	image, err := embedded.Kernel()
	if err != nil {
		return "embedded, unreadable: " + err.Error()
	}
	v, err := doctor.KernelVersion(bytes.NewReader(image))
	if err != nil || v == "" {
		return "embedded, version unknown"
	}
	return "Linux " + v + " (embedded)"
}

func usage(w io.Writer) {
	fmt.Fprint(w, `cowork-vmm — a helper for Claude Desktop's Cowork mode: it runs each session's
tools in a sandboxed guest (a KVM virtual machine, or namespaced host processes).

Usage:
  cowork-vmm -socket PATH [-debug]       serve the desktop client on a Unix socket (helper mode)
  cowork-vmm run [flags] -- CMD [ARG…]   run one command in a fresh guest, like "docker run"
  cowork-vmm client [flags] -- CMD [ARG…]
                                         run one command in a session of a running helper,
                                         through its socket, as Claude Desktop does
                                         (cowork-vmm client --help for its flags)
  cowork-vmm agent [--fd N] [--egress-fd M] [--debug]
                                         the guest agent (started by the process backend)
  cowork-vmm guest-request [--timeout D] METHOD [JSON]
                                         inside a guest: ask the desktop client (a request
                                         event; its sendGuestResponse is printed)
  cowork-vmm sudo [-u root] [-s] [--] CMD [ARG…]
                                         inside a guest (as sudo on PATH): run CMD as root of a
                                         namespace of its own in this session (apt-get, dpkg)
  cowork-vmm doctor [--json] [--boot]    check what this host can run, with a fix for each problem
  cowork-vmm doctor --reset-root PROFILE|all
                                         remove a profile's root disk (its VM stopped), so its
                                         next VM starts on a clean root
  cowork-vmm kernel-needed               exit 0 when this host's KVM boots Linux and no guest
                                         kernel is built (make run then runs make kernel), else 1
  cowork-vmm version                     print version, commit and Go version
  cowork-vmm help                        this text

run flags:
  --mount HOST:GUEST[:ro]   share a host path at GUEST (repeatable; ":ro" for read-only)
  --env KEY=VALUE           set an environment variable (repeatable)
  --workdir PATH            guest working directory (default: the run's session directory)
  --mem MiB, --cpus N       guest size (VM backend)
  --kernel PATH             guest kernel (vmlinux or bzImage) for the VM backend; with
                            --initrd/--cmdline or no command, boot it directly on the VMM
                            with its serial console on the terminal
  --initrd PATH             initrd for a direct --kernel boot
  --cmdline ARGS            extra kernel command line for a direct --kernel boot
  --bundle DIR              boot the client's VM bundle DIR (its rootfs.img) as the guest's
                            userland (kvm backend; changes last the run)
  --debug                   log debug messages to stderr

Environment:
  COWORK_VMM_BACKEND   "kvm" (default: a real VM) or "process" (user+mount+pid namespaces,
                       for hosts without KVM). "run" falls back to "process" with a note
                       when the kvm backend is unavailable and the variable is unset.
  XDG_RUNTIME_DIR      where the desktop client puts the socket
                       ($XDG_RUNTIME_DIR/claude-cowork-vm.sock)
  XDG_DATA_HOME        session data lives in $XDG_DATA_HOME/cowork-vmm/sessions (the first
                       client profile; others in .../profiles/<id>/sessions), with the
                       state a restarted helper reloads (default ~/.local/share/cowork-vmm)

Logs go to stderr, one line per notable event (the desktop client keeps them in
its cowork_vm_node.log).

Examples:
  cowork-vmm -socket "$XDG_RUNTIME_DIR/claude-cowork-vm.sock"
  cowork-vmm run -- sh -c 'echo hello from the guest; uname -a'
  cowork-vmm client -- uname -a          (with a helper serving the default socket)
  COWORK_VMM_BACKEND=process cowork-vmm run --mount "$PWD:/work" --workdir /work -- ls -la
  cowork-vmm run --mount /etc/hosts:/data/hosts:ro -- cat /data/hosts
  cowork-vmm run --kernel vmlinux --initrd initrd.cpio --mem 512 --cpus 2 --cmdline loglevel=7
`)
}

// newLogger logs text lines to w at a level the returned var controls.
func newLogger(w io.Writer, debug bool) (*slog.Logger, *slog.LevelVar) {
	level := new(slog.LevelVar)
	if debug {
		level.Set(slog.LevelDebug)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), level
}

// flagSet returns a FlagSet that reports errors instead of exiting.
func flagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
