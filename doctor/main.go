package doctor

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// Main is `cowork-vmm doctor [--json] [--boot [--boot-timeout D]] [--client-helper PATH]`: it
// prints the report and returns the exit status (0 when the helper can
// serve and its default backend works, 1 when not, 2 on a usage error).
// `cowork-vmm doctor --reset-root PROFILE` instead removes the profile's
// root disk (resetroot.go): 0 when done, 1 when refused (in use) or failed.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runMain(ctx, args, stdout, stderr, nil)
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer, host *Host) int {
	fs := flag.NewFlagSet("cowork-vmm doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	boot := fs.Bool("boot", false, "also boot a guest on each usable backend and time it")
	bootTimeout := fs.Duration("boot-timeout", DefaultBootTimeout, "give up on a trial boot after this long")
	clientHelper := fs.String("client-helper", "", "where Claude Desktop's helper binary is (default "+ClientHelperPath+")")
	resetRoot := fs.String("reset-root", "", "remove the root disk of `PROFILE` (a directory name in profiles/, or "+ResetAll+") unless its VM runs, and print no report")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: cowork-vmm doctor [--json] [--boot [--boot-timeout D]] [--client-helper PATH]")
		fmt.Fprintln(stderr, "       cowork-vmm doctor --reset-root PROFILE")
		fmt.Fprintln(stderr, "Checks what this host can run and says what to change. Exit status 0 when the")
		fmt.Fprintln(stderr, "helper can serve and its backend ($COWORK_VMM_BACKEND, default kvm) works, else 1.")
		fmt.Fprintln(stderr, "The root-disks check lists each profile's root disk (the guest's writable root,")
		fmt.Fprintln(stderr, "$XDG_DATA_HOME/cowork-vmm/profiles/PROFILE/root.img). --reset-root PROFILE removes")
		fmt.Fprintln(stderr, "it, or every profile's with \"all\", so the next VM starts on a clean root; it")
		fmt.Fprintln(stderr, "refuses a disk in use (stop the VM first) and exits 1 then, follows no symlink,")
		fmt.Fprintln(stderr, "and prints what it removed and the bytes freed.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cowork-vmm doctor: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	if isFlagSet(fs, "reset-root") {
		h := RealHost()
		if host != nil {
			h = host.withDefaults()
		}
		return resetRootMain(h, *resetRoot, stdout, stderr)
	}
	report := Run(ctx, Options{Host: host, Boot: *boot, BootTimeout: *bootTimeout, ClientHelperPath: *clientHelper})
	var err error
	if *asJSON {
		err = report.WriteJSON(stdout)
	} else {
		err = report.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "cowork-vmm doctor: writing the report: %v\n", err)
		return 1
	}
	return report.ExitCode()
}

// isFlagSet says whether the command line gave the flag name (an empty
// --reset-root is a bad name, not no flag).
func isFlagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
