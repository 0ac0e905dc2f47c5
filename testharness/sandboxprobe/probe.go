package sandboxprobe

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Injected is what the probe tries to push into a terminal's input: a
// command a shell reading that terminal would run.
const Injected = "echo COWORK-INJECTED\n"

// OK is a probe's result when the call succeeded.
const OK = "ok"

// Probe names.
const (
	SessionKeyring = "session-keyring" // its id, or the errno
	KeyringName    = "session-keyring-description"
	AddKey         = "add_key"
	TTYOpen        = "tty-open"
	TTYInject      = "tty-tiocsti"   // TIOCSTI on /dev/tty, if it opened
	StdinInject    = "stdin-tiocsti" // TIOCSTI on descriptor 0
	ProcKeys       = "proc-keys"     // the descriptions /proc/keys lists, or the error
	ProcKeysUnmask = "proc-keys-unmount"
	// None is ProcKeys' result when /proc/keys lists nothing.
	None = "(none)"
)

// result is "ok" or the errno's message.
func result(errno syscall.Errno) string {
	if errno == 0 {
		return OK
	}
	return errno.Error()
}

// Run makes the probes and writes their results to w. inSandbox adds one
// that is only safe inside a sandbox's mount namespace: unmounting the
// cover over /proc/keys.
func Run(w io.Writer, inSandbox bool) {
	line := func(name, value string) { fmt.Fprintf(w, "%s: %s\n", name, value) }
	if id, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false); err == nil {
		line(SessionKeyring, strconv.Itoa(id))
	} else {
		line(SessionKeyring, err.Error())
	}
	desc, err := unix.KeyctlString(unix.KEYCTL_DESCRIBE, unix.KEY_SPEC_SESSION_KEYRING)
	if err == nil {
		// "type;uid;gid;perm;description"
		line(KeyringName, desc[strings.LastIndexByte(desc, ';')+1:])
	} else {
		line(KeyringName, err.Error())
	}
	_, err = unix.AddKey("user", "cowork-probe", []byte("x"), unix.KEY_SPEC_SESSION_KEYRING)
	line(AddKey, errString(err))

	if inSandbox {
		line(ProcKeysUnmask, errString(unix.Unmount("/proc/keys", unix.MNT_DETACH)))
	}
	line(ProcKeys, procKeys())
	line(StdinInject, inject(0))
	tty, err := unix.Open("/dev/tty", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	line(TTYOpen, errString(err))
	if err == nil {
		line(TTYInject, inject(tty))
		unix.Close(tty)
	}
}

// inject pushes Injected into fd's terminal input, byte by byte.
func inject(fd int) string {
	for i := 0; i < len(Injected); i++ {
		b := Injected[i]
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&b)))
		if errno != 0 {
			return result(errno)
		}
	}
	return OK
}

func errString(err error) string {
	if err == nil {
		return OK
	}
	return err.Error()
}

// Parse reads Run's lines back (other lines are ignored).
func Parse(out string) map[string]string {
	got := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if name, value, ok := strings.Cut(strings.TrimSpace(l), ": "); ok {
			got[name] = value
		}
	}
	return got
}

// procKeys lists the key descriptions /proc/keys shows ("," between
// them): the keys the process may view, which names the user's keys even
// where keyctl is refused.
func procKeys() string {
	b, err := os.ReadFile("/proc/keys")
	if err != nil {
		return err.Error()
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// "serial flags usage expiry perm uid gid type description: summary"
		if f := strings.Fields(l); len(f) >= 9 {
			names = append(names, strings.TrimSuffix(f[8], ":"))
		}
	}
	if len(names) == 0 {
		return None
	}
	return strings.Join(names, ",")
}
