package bench

import (
	"fmt"
	"io"
)

// HostCanBootVMs reports whether this host's KVM can boot a Linux guest,
// and why not. `make bench` runs the bench directly when it can and inside
// the nested harness otherwise.
func HostCanBootVMs() (bool, string) {
	state, why := hostKVM()
	return state == "real", why
}

// PrintReport writes the Markdown report of a report.json to w (the nested
// driver shows what the bench inside the harness measured).
func PrintReport(w io.Writer, path string) error {
	rep, err := ReadJSON(path)
	if err != nil {
		return fmt.Errorf("reading the bench report: %w", err)
	}
	return WriteMarkdown(w, rep)
}
