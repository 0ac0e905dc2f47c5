package agent

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxToolOutput bounds what runTool keeps of a tool's output for its error.
const maxToolOutput = 16 << 10

// runTool runs the program at path with args as the agent itself (not a
// spawn: root, the agent's namespaces) and waits for it, up to timeout;
// an error carries the tail of its output. The agent's reaper reaps every
// child, so the tool is registered with it as a process the way a spawn is
// (the table lock held across the fork), and its status comes from there.
func (t *processTable) runTool(timeout time.Duration, path string, args ...string) error {
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devNull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	p := &process{id: "tool " + path, status: make(chan unix.WaitStatus, 1)}
	attr := &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		Files: []uintptr{devNull.Fd(), w.Fd(), w.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	t.mu.Lock()
	pid, err := forkExec(path, append([]string{path}, args...), attr)
	if err == nil {
		p.pid = pid
		t.byPID[pid] = p
	}
	t.mu.Unlock()
	w.Close()
	if err != nil {
		return fmt.Errorf("starting %s: %w", path, err)
	}
	output := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(r, maxToolOutput))
		_, _ = io.Copy(io.Discard, r)
		output <- b
	}()
	var ws unix.WaitStatus
	select {
	case ws = <-p.status:
	case <-time.After(timeout):
		_ = unix.Kill(-pid, unix.SIGKILL)
		<-p.status
		return fmt.Errorf("%s did not finish within %v", path, timeout)
	}
	out := bytes.TrimSpace(<-output)
	if ws.Exited() && ws.ExitStatus() == 0 {
		return nil
	}
	err = fmt.Errorf("%s failed (status %#x)", path, int(ws))
	if ws.Exited() {
		err = fmt.Errorf("%s exited with status %d", path, ws.ExitStatus())
	}
	if len(out) > 0 {
		err = fmt.Errorf("%w: %s", err, out)
	}
	return err
}
