package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// symbol is how a terminal shows a status.
func symbol(s Status) string {
	switch s {
	case StatusOK:
		return "✓"
	case StatusFail:
		return "✗"
	case StatusWarn:
		return "!"
	default:
		return "-"
	}
}

// WriteJSON writes the report as indented JSON.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a terminal: a symbol, the title padded to
// one column, the finding, and the fix indented below.
func (r Report) WriteText(w io.Writer) error {
	width := 0
	for _, c := range r.Checks {
		width = max(width, len(c.Title))
	}
	var b strings.Builder
	group := func(name, heading string) {
		first := true
		for _, c := range r.Checks {
			if c.Group != name {
				continue
			}
			if first {
				fmt.Fprintf(&b, "%s\n", heading)
				first = false
			}
			fmt.Fprintf(&b, "  %s %-*s  %s\n", symbol(c.Status), width, c.Title, c.Detail)
			if c.Fix != "" {
				fmt.Fprintf(&b, "    %*s  fix: %s\n", width, "", c.Fix)
			}
		}
	}
	group(GroupCoworkVMM, "What cowork-vmm needs")
	b.WriteString("\n")
	group(GroupClient, "What Claude Desktop's support gate checks (before it starts any helper)")
	b.WriteString("\n")
	v := r.Verdict
	usable := "none"
	if len(v.UsableBackends) > 0 {
		usable = strings.Join(v.UsableBackends, ", ")
	}
	fmt.Fprintf(&b, "Verdict: %s.\n", v.Summary)
	fmt.Fprintf(&b, "  backend the helper uses: %s (works: %s); usable backends: %s\n", v.DefaultBackend, yesNo(v.DefaultBackendWorks), usable)
	fmt.Fprintf(&b, "  Claude Desktop: %s\n", v.ClientGate)
	_, err := io.WriteString(w, b.String())
	return err
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
