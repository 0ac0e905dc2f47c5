// Package job is the contract between the nested harness on the host and
// the outer guest's /init (outerinit): the job description the host packs
// into the outer initramfs, the guest paths and 9p tags, and the marker
// lines outerinit prints on the serial console.
package job

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// Job is what the host tells the outer guest's /init to do.
type Job struct {
	// Token makes the serial-console markers of this run unguessable to the
	// payload, so its output cannot fake a result.
	Token string `json:"token"`
	// Cmd is the payload command, run in the root built from the host's
	// root; Cmd[0] is looked up in the guest's PATH when it has no slash.
	Cmd []string `json:"cmd"`
	// Env is added to the payload's default environment (later wins).
	Env []string `json:"env,omitempty"`
	// Dir is the payload's working directory inside the guest.
	Dir string `json:"dir"`
	// Timeout bounds the payload; outerinit kills it and reports
	// TimeoutExitCode.
	Timeout time.Duration `json:"timeout"`
	// Shares are host directories outerinit mounts read-only at their own
	// path (virtio-9p tag ShareTag(i)): ones the payload's root would not
	// show, because they lie under a FreshDir (a clone in /tmp, say).
	Shares []string `json:"shares,omitempty"`
	// UserlandRoot makes outerinit build the payload's root from the arm64
	// userland shared read-only over 9p (tag UserlandTag), with a tmpfs
	// over it and busybox's applets linked (the arm64 outer guest, to
	// which the host's x86 root is useless), instead of the host's root.
	UserlandRoot bool `json:"userland_root,omitempty"`
}

// MaxShares bounds Job.Shares (each is a virtio-mmio device).
const MaxShares = 4

// ShareTag is the virtio-9p mount tag of Job.Shares[i].
func ShareTag(i int) string { return "share" + strconv.Itoa(i) }

// FreshDir says whether the payload's root gives the host's top-level
// directory name a fresh filesystem instead of the host's (kind: "proc",
// "sysfs", "dev", "tmpfs" or "payload"), so nothing of the host's under it
// is visible in the outer guest.
func FreshDir(name string) (kind string, fresh bool) {
	switch name {
	case "proc":
		return "proc", true
	case "sys":
		return "sysfs", true
	case "dev":
		return "dev", true
	case "tmp", "run", "root":
		return "tmpfs", true
	case "payload":
		return "payload", true
	}
	return "", false
}

// FreshDirNames lists every name FreshDir says is fresh.
func FreshDirNames() []string {
	return []string{"proc", "sys", "dev", "tmp", "run", "root", "payload"}
}

// HiddenInGuest says whether the host path p (absolute, clean) is not
// visible at the same path in the payload's root: it lies under a
// FreshDir, or under /var/tmp, which outerinit also replaces.
func HiddenInGuest(p string) bool {
	rel := strings.TrimPrefix(path.Clean(p), "/")
	top, _, _ := strings.Cut(rel, "/")
	if _, fresh := FreshDir(top); fresh {
		return true
	}
	return rel == "var/tmp" || strings.HasPrefix(rel, "var/tmp/")
}

// Guest-side names shared by the harness and outerinit.
const (
	// Path is where the job sits in the outer initramfs.
	Path = "/job.json"
	// Busybox is where a UserlandRoot job's static busybox sits in the
	// payload's root.
	Busybox = "/bin/busybox"
	// HostRootTag, UserlandTag and PayloadTag are the virtio-9p mount tags.
	HostRootTag = "hostroot"
	UserlandTag = "userland"
	PayloadTag  = "payload"
	// PayloadDir is where the payload directory appears in the guest.
	PayloadDir = "/payload"
	// TimeoutExitCode is the payload's exit code when outerinit killed it
	// for exceeding Job.Timeout (as timeout(1) reports it).
	TimeoutExitCode = 124
)

// Marker kinds outerinit prints at the start of a serial-console line,
// followed by a space, the job's token and, for some, a value.
const (
	MarkerInit  = "NESTED-INIT"  // value "uptime=<seconds>": outer /init started
	MarkerBegin = "NESTED-BEGIN" // payload output starts on the next line
	MarkerExit  = "NESTED-EXIT"  // value "<code>": payload finished
	MarkerError = "NESTED-ERROR" // value: why outerinit could not run the payload
	// MarkerClock's value is the outer kernel's current clocksource
	// (ClocksourcePath), printed before the payload starts and again after
	// it ends: a kernel can fall back to a coarse one meanwhile.
	MarkerClock = "NESTED-CLOCK"
	// MarkerAlive is printed every AliveInterval while the payload runs,
	// with value "uptime=<seconds>": a guest that stops printing it has
	// stopped keeping time (its kernel is stuck), whatever qemu's CPU use.
	MarkerAlive = "NESTED-ALIVE"
)

// AliveInterval is how often outerinit prints MarkerAlive.
const AliveInterval = 20 * time.Second

// ClocksourcePath names the clocksource the outer kernel keeps time with.
const ClocksourcePath = "/sys/devices/system/clocksource/clocksource0/current_clocksource"

// CoarseClocksource reports whether a clocksource ticks only with the
// timer interrupt (jiffies: 4 ms steps at HZ=250), too coarse for the
// millisecond figures a bench reports.
func CoarseClocksource(name string) bool {
	return name == "jiffies" || name == "refined-jiffies"
}

// Marker formats a marker line (without newline).
func Marker(kind, token, value string) string {
	if value == "" {
		return kind + " " + token
	}
	return kind + " " + token + " " + value
}

// Validate checks a decoded job.
func (j *Job) Validate() error {
	switch {
	case j.Token == "":
		return fmt.Errorf("job: empty token")
	case len(j.Cmd) == 0 || j.Cmd[0] == "":
		return fmt.Errorf("job: empty command")
	case j.Timeout <= 0:
		return fmt.Errorf("job: timeout %v must be positive", j.Timeout)
	case j.Dir == "" || j.Dir[0] != '/':
		return fmt.Errorf("job: working directory %q must be absolute", j.Dir)
	case len(j.Shares) > MaxShares:
		return fmt.Errorf("job: %d shared directories, at most %d", len(j.Shares), MaxShares)
	}
	for _, d := range j.Shares {
		// qemu's -fsdev takes the path in a comma-separated option list.
		if d == "" || d[0] != '/' || path.Clean(d) != d || d == "/" || strings.ContainsAny(d, ",\x00") {
			return fmt.Errorf("job: shared directory %q must be an absolute, clean path other than / without commas", d)
		}
	}
	return nil
}

// Decode parses and validates a job.
func Decode(data []byte) (Job, error) {
	var j Job
	if err := json.Unmarshal(data, &j); err != nil {
		return Job{}, fmt.Errorf("job: %w", err)
	}
	if err := j.Validate(); err != nil {
		return Job{}, err
	}
	return j, nil
}
