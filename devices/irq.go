package devices

// IRQ is an interrupt line into the guest. Trigger raises one edge (for a
// KVM irqfd, one write to the eventfd). It is safe for concurrent use and
// must not block for long: devices call it from vCPU threads and from their
// own goroutines.
type IRQ interface {
	Trigger() error
}

// IRQFunc adapts a function to the IRQ interface.
type IRQFunc func() error

// Trigger calls f.
func (f IRQFunc) Trigger() error { return f() }
