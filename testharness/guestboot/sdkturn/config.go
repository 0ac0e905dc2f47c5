package sdkturn

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/testharness/guestboot/fsbench"
)

// Kernel command line keys of the mode (testinit reads /proc/cmdline).
const (
	// KeyBinary is the CLI's path inside the data share ("2.1.337/claude");
	// its presence selects the mode.
	KeyBinary = "guestboot.sdk"
	// KeyData is the mount of the directory holding the CLI (fsbench's
	// Mount.Word).
	KeyData = "guestboot.sdkdata"
	// KeyRoot is the mount of the host's root, read-only (Mount.Word): the
	// CLI's C library and loader, and the root it runs chrooted in.
	KeyRoot = "guestboot.sdkroot"
)

// Console lines: each turn prints Marker + " " + its fsbench.Result's
// Fields; EndMarker follows the last.
const (
	Marker    = "TESTINIT SDK"
	EndMarker = "TESTINIT SDK END"
)

// Config is the mode's configuration.
type Config struct {
	// Binary is the CLI's path relative to the data share.
	Binary     string
	Data, Root fsbench.Mount
}

// Cmdline returns the kernel command line words for c.
func (c Config) Cmdline() string {
	return KeyBinary + "=" + c.Binary + " " + KeyData + "=" + c.Data.Word() + " " + KeyRoot + "=" + c.Root.Word()
}

// Validate checks c: a relative binary path that stays in the share, and
// two shared file systems (no raw disk).
func (c Config) Validate() error {
	if err := checkBinary(c.Binary); err != nil {
		return err
	}
	for _, m := range []struct {
		name string
		m    fsbench.Mount
	}{{"data", c.Data}, {"root", c.Root}} {
		if err := m.m.Validate(); err != nil {
			return fmt.Errorf("sdk mode: %s %w", m.name, err)
		}
		if m.m.Type == fsbench.TypeBlock {
			return fmt.Errorf("sdk mode: the %s mount is a raw disk; want a shared file system", m.name)
		}
	}
	return nil
}

// checkBinary accepts a clean relative path of plain words: it goes on
// the kernel command line and is joined to a mount point.
func checkBinary(p string) error {
	switch {
	case p == "":
		return errors.New("sdk mode: no binary path")
	case path.IsAbs(p) || path.Clean(p) != p || p == "." || strings.HasPrefix(p, "../") || p == "..":
		return fmt.Errorf("sdk mode: binary path %q: want a clean path inside the share", p)
	case strings.ContainsFunc(p, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-/", r))
	}):
		return fmt.Errorf("sdk mode: binary path %q: want letters, digits and ._-/ only", p)
	}
	return nil
}

// ParseCmdline reads the mode's configuration from a kernel command line:
// ok is false when the mode is off (no KeyBinary word), err set when it is
// on but a value is bad.
func ParseCmdline(cmdline string) (c Config, ok bool, err error) {
	for _, word := range strings.Fields(cmdline) {
		key, value, _ := strings.Cut(word, "=")
		var perr error
		switch key {
		case KeyBinary:
			ok, c.Binary = true, value
		case KeyData:
			c.Data, perr = fsbench.ParseMount(value)
		case KeyRoot:
			c.Root, perr = fsbench.ParseMount(value)
		}
		if perr != nil && err == nil {
			err = fmt.Errorf("sdk mode: %s: %w", key, perr)
		}
	}
	if !ok {
		return Config{}, false, nil
	}
	if err != nil {
		return c, true, err
	}
	return c, true, c.Validate()
}

// Line formats a turn's result as its console line.
func Line(r fsbench.Result) string { return Marker + " " + r.Fields() }

// ParseLine parses a Line, possibly after other text (a console prefix).
// ok is false when line holds no result (EndMarker is none); err is set
// when it holds a malformed one.
func ParseLine(line string) (r fsbench.Result, ok bool, err error) {
	i := strings.Index(line, Marker+" workload=")
	if i < 0 {
		return fsbench.Result{}, false, nil
	}
	r, err = fsbench.ParseFields(line[i+len(Marker)+1:])
	return r, true, err
}

// Results finds the turns' results in a console transcript, up to
// EndMarker. It fails when the guest never got there or printed a
// malformed line.
func Results(console string) ([]fsbench.Result, error) {
	var out []fsbench.Result
	for _, line := range strings.Split(console, "\n") {
		line = strings.TrimRight(line, "\r")
		if strings.HasSuffix(line, EndMarker) {
			return out, nil
		}
		r, ok, err := ParseLine(line)
		if !ok {
			continue
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, errors.New("the guest did not finish the SDK turns (no " + EndMarker + " line)")
}
