package proxy

import (
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/guest/proxy/netns"
)

// Namespaced is a spawn's proxy listening inside a fresh network namespace
// (only loopback) that the spawn's process is forked into. It is what the
// agent makes per spawn:
//
//	np, err := proxy.NewNamespaced(proxy.Config{SpawnID: id, Token: tok, Dial: dialer, Logger: log})
//	env := proxy.MergeEnv(sp.Env, np.URL())
//	err = np.Start(func() error { pid, err = syscall.ForkExec(path, argv, attr); return err })
//	... when the process has exited: np.Close()
type Namespaced struct {
	*Proxy
	ns *netns.Namespace
}

// NewNamespaced creates the namespace and starts the proxy in it; cfg's
// Listener must be nil (it is made inside the namespace).
func NewNamespaced(cfg Config) (*Namespaced, error) {
	if cfg.Listener != nil {
		return nil, fmt.Errorf("proxy: NewNamespaced makes its own listener")
	}
	ns, err := netns.New()
	if err != nil {
		return nil, fmt.Errorf("proxy: isolating spawn %s: %w", cfg.SpawnID, err)
	}
	l, err := ns.Listen("127.0.0.1:0")
	if err != nil {
		ns.Close()
		return nil, err
	}
	cfg.Listener = l
	p, err := New(cfg)
	if err != nil {
		l.Close()
		ns.Close()
		return nil, err
	}
	return &Namespaced{Proxy: p, ns: ns}, nil
}

// Start runs fork on the namespace's thread, so that the process it starts
// (syscall.ForkExec, exec.Cmd.Start) lives in the namespace, and then
// releases the thread: it may be called once. The namespace lives on with
// the process and the proxy's listener.
func (n *Namespaced) Start(fork func() error) error {
	defer n.ns.Close()
	return n.ns.Do(fork)
}

// Close stops the proxy (and releases the thread if Start was never called).
func (n *Namespaced) Close() error {
	n.ns.Close()
	return n.Proxy.Close()
}
