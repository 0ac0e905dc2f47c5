package kvm

import (
	"os"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestBlockingSyscall: blockingSyscall returns the call's result and its
// errno as unix.Syscall does, and runOnce the errno as an error.
func TestBlockingSyscall(t *testing.T) {
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	msg := []byte("abc")
	n, errno := blockingSyscall(unix.SYS_WRITE, uintptr(p[1]), uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg)))
	require.Zero(t, errno)
	require.EqualValues(t, len(msg), n)
	got := make([]byte, 8)
	n, errno = blockingSyscall(unix.SYS_READ, uintptr(p[0]), uintptr(unsafe.Pointer(&got[0])), uintptr(len(got)))
	require.Zero(t, errno)
	require.Equal(t, msg, got[:n])

	_, errno = blockingSyscall(unix.SYS_READ, ^uintptr(0), uintptr(unsafe.Pointer(&got[0])), 1)
	require.Equal(t, unix.EBADF, errno)
	require.ErrorIs(t, runOnce(-1), unix.EBADF)
}

// BenchmarkBlockedThreadHandoff plays a vCPU and a device with one P
// (GOMAXPROCS 1, a one-CPU host's): the vCPU's goroutine, on a thread of
// its own, notifies the device by a byte on a pipe (an ioeventfd) and
// waits in a blocking read of another (the guest running, in KVM_RUN);
// the device's goroutine, woken by the network poller, answers with a
// byte there (the interrupt). One op is one round trip. "block" makes the
// vCPU's read with blockingSyscall, as runOnce makes KVM_RUN; "plain" with
// unix.Syscall, whose P sysmon must take back before the device can run.
func BenchmarkBlockedThreadHandoff(b *testing.B) {
	modes := []struct {
		name string
		read func(fd int, buf []byte) unix.Errno
	}{
		{"block", func(fd int, buf []byte) unix.Errno {
			_, errno := blockingSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
			return errno
		}},
		{"plain", func(fd int, buf []byte) unix.Errno {
			_, _, errno := unix.Syscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
			return errno
		}},
	}
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) { benchHandoff(b, mode.read) })
	}
}

func benchHandoff(b *testing.B, read func(fd int, buf []byte) unix.Errno) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var guest, notify [2]int
	require.NoError(b, unix.Pipe2(guest[:], unix.O_CLOEXEC))
	require.NoError(b, unix.Pipe2(notify[:], unix.O_CLOEXEC|unix.O_NONBLOCK))
	notified := os.NewFile(uintptr(notify[0]), "notify") // in the poller
	defer notified.Close()
	for _, fd := range []int{guest[0], guest[1], notify[1]} {
		defer unix.Close(fd)
	}
	rounds := b.N
	go func() { // the device
		buf := make([]byte, 1)
		for range rounds {
			if _, err := notified.Read(buf); err != nil {
				return
			}
			if _, err := unix.Write(guest[1], buf); err != nil {
				return
			}
		}
	}()
	vcpu := make(chan error, 1)
	b.ResetTimer()
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		buf := []byte{1}
		for range rounds {
			if _, err := unix.Write(notify[1], buf); err != nil {
				vcpu <- err
				return
			}
			if errno := read(guest[0], buf); errno != 0 {
				vcpu <- errno
				return
			}
		}
		vcpu <- nil
	}()
	require.NoError(b, <-vcpu)
}
