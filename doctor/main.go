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
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: cowork-vmm doctor [--json] [--boot [--boot-timeout D]] [--client-helper PATH]")
		fmt.Fprintln(stderr, "Checks what this host can run and says what to change. Exit status 0 when the")
		fmt.Fprintln(stderr, "helper can serve and its backend ($COWORK_VMM_BACKEND, default kvm) works, else 1.")
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
