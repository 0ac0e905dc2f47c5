// Package job is the contract between the nested harness on the host and
// the outer guest's /init (outerinit): the job description the host packs
// into the outer initramfs, the guest paths and 9p tags, and the marker
// lines outerinit prints on the serial console.
package job

import (
	"encoding/json"
	"fmt"
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
}

// Guest-side names shared by the harness and outerinit.
const (
	// Path is where the job sits in the outer initramfs.
	Path = "/job.json"
	// HostRootTag and PayloadTag are the virtio-9p mount tags.
	HostRootTag = "hostroot"
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
)

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
