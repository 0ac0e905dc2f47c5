package agent

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// GuestRequestMain is `cowork-vmm guest-request [--timeout D] METHOD [JSON]`,
// run by a process in the guest: it asks the desktop client METHOD with
// params JSON (default {}) over the guest-request socket its environment
// names (protocol.GuestRequestSocketEnv), prints the answer's result as
// JSON on stdout and exits 0; an error answer goes to stderr with exit
// status 1; a usage or channel failure exits 2. args are the arguments
// after "guest-request".
func GuestRequestMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("guest-request", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 0, fmt.Sprintf("how long to wait for the client's answer (default %v, at most %v)",
		protocol.DefaultGuestRequestTimeout, protocol.MaxGuestRequestTimeout))
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: cowork-vmm guest-request [--timeout D] METHOD [JSON]\n\n"+
			"Asks the desktop client METHOD with params JSON (default {}) and prints its answer.\n"+
			"Runs inside the guest, where $%s names the socket.\n\n", protocol.GuestRequestSocketEnv)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		fs.Usage()
		return 2
	}
	call := protocol.GuestCall{Method: fs.Arg(0), Params: json.RawMessage("{}"), TimeoutMillis: timeout.Milliseconds()}
	if fs.NArg() == 2 {
		if !json.Valid([]byte(fs.Arg(1))) {
			fmt.Fprintf(stderr, "guest-request: the params are not JSON: %.80s\n", fs.Arg(1))
			return 2
		}
		call.Params = json.RawMessage(fs.Arg(1))
	}
	resp, err := CallGuest(os.Getenv(protocol.GuestRequestSocketEnv), call)
	if err != nil {
		fmt.Fprintf(stderr, "guest-request: %v\n", err)
		return 2
	}
	if !resp.Success {
		fmt.Fprintf(stderr, "guest-request: %s: %s\n", call.Method, resp.Error)
		return 1
	}
	result := resp.Result
	if len(result) == 0 {
		result = json.RawMessage("null")
	}
	fmt.Fprintf(stdout, "%s\n", result)
	return 0
}

// CallGuest makes one call on the guest-request socket at socket and
// returns the answer; an error means the channel failed, not the call.
func CallGuest(socket string, call protocol.GuestCall) (protocol.Response, error) {
	if socket == "" {
		return protocol.Response{}, fmt.Errorf("no guest-request socket: $%s is not set (this runs in a process the helper spawned)", protocol.GuestRequestSocketEnv)
	}
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return protocol.Response{}, fmt.Errorf("connecting to the guest-request socket: %w", err)
	}
	defer conn.Close()
	// The agent answers by the call's timeout (and its backstop); wait a
	// little longer than both.
	_ = conn.SetDeadline(time.Now().Add(call.Timeout() + guestCallBackstop + guestCallReadTimeout))
	if err := protocol.WriteJSON(conn, call); err != nil {
		return protocol.Response{}, fmt.Errorf("sending the call: %w", err)
	}
	return readResponse(conn)
}
