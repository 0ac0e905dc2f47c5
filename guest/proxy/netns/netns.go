// Package netns gives a spawned process a network namespace of its own with
// only loopback up, so that the spawn's proxy (listening inside it) is its
// only way out, and no other spawn's proxy is reachable from it.
//
// Namespaces belong to threads. A Namespace is one OS thread, locked for its
// whole life, that unshared CLONE_NEWNET: closures passed to Do run on it, so
// a socket created there lives in the namespace and a child forked there
// (syscall.ForkExec, exec.Cmd.Start) inherits it. Close ends the goroutine
// without unlocking, so the Go runtime destroys the thread instead of
// reusing it in the wrong namespace.
package netns

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Namespace is a fresh network namespace held by a dedicated thread.
type Namespace struct {
	work chan func()
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

// ErrClosed: Do after Close.
var ErrClosed = errors.New("netns: namespace closed")

// New creates the namespace and brings its loopback up. It needs
// CAP_SYS_ADMIN and CAP_NET_ADMIN in the current user namespace (root in
// the VM, root of the sandbox's user namespace in the process backend).
func New() (*Namespace, error) {
	ns := &Namespace{work: make(chan func()), quit: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan error, 1)
	go ns.run(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return ns, nil
}

func (ns *Namespace) run(ready chan<- error) {
	runtime.LockOSThread()
	// Never unlocked: the thread dies with this goroutine.
	defer close(ns.done)
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		ready <- fmt.Errorf("netns: creating a network namespace for the process (unshare CLONE_NEWNET; needs CAP_SYS_ADMIN): %w", err)
		return
	}
	if err := LoopbackUp(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for {
		select {
		case fn := <-ns.work:
			fn()
		case <-ns.quit:
			return
		}
	}
}

// LoopbackUp sets IFF_UP on "lo" of the current thread's namespace (the
// test guest's init brings up its own with it).
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netns: socket for configuring loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("netns: reading loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("netns: bringing loopback up (needs CAP_NET_ADMIN): %w", err)
	}
	return nil
}

// Do runs fn on the namespace's thread and returns its error. fn must not
// unlock the thread or start work that outlives it on this thread (new
// goroutines run on other threads, in the original namespace).
func (ns *Namespace) Do(fn func() error) error {
	var err error
	finished := make(chan struct{})
	select {
	case ns.work <- func() { err = fn(); close(finished) }:
	case <-ns.done:
		return ErrClosed
	}
	<-finished
	return err
}

// Listen opens a TCP listener inside the namespace ("127.0.0.1:0" for the
// proxy). The listener keeps working from any goroutine.
func (ns *Namespace) Listen(address string) (net.Listener, error) {
	var l net.Listener
	err := ns.Do(func() error {
		var err error
		l, err = net.Listen("tcp", address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns: listening on %s inside the namespace: %w", address, err)
	}
	return l, nil
}

// Close releases the thread; the namespace lives on while a process or
// socket still uses it.
func (ns *Namespace) Close() error {
	ns.once.Do(func() { close(ns.quit) })
	<-ns.done
	return nil
}
