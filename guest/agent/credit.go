package agent

import (
	"sync"
	"time"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// outputCredit is a process's output flow control (see
// protocol.SpawnParams.OutputWindow): its pumps send an event only while
// credit is above zero, and otherwise wait, without reading their pipes,
// until the helper gives more (protocol.AgentMethodCredit) or the limit is
// lifted (shutdown). Unlimited when the helper gave no window.
type outputCredit struct {
	mu      sync.Mutex
	limited bool
	avail   int64
	wake    chan struct{} // closed and replaced when credit comes
	waiting int           // pumps waiting for credit
	since   time.Time     // when the first of them began
	waited  time.Duration // time spent waiting, before since
}

func newOutputCredit(window int64) *outputCredit {
	return &outputCredit{limited: window > 0, avail: window, wake: make(chan struct{})}
}

// take uses the credit of one event of cost bytes, first waiting until some
// is available.
func (c *outputCredit) take(cost int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.limited && c.avail <= 0 {
		if c.waiting == 0 {
			c.since = time.Now()
		}
		c.waiting++
		for c.limited && c.avail <= 0 {
			wake := c.wake
			c.mu.Unlock()
			<-wake
			c.mu.Lock()
		}
		c.waiting--
		if c.waiting == 0 {
			c.waited += time.Since(c.since)
		}
	}
	c.avail -= cost
}

// add gives n more bytes of credit (at most protocol.MaxOutputWindow held).
func (c *outputCredit) add(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.avail = min(c.avail+n, protocol.MaxOutputWindow)
	close(c.wake)
	c.wake = make(chan struct{})
}

// unlimit lifts flow control for good: the process is being ended, and its
// output and exit must go out while there is a helper to take them.
func (c *outputCredit) unlimit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limited = false
	close(c.wake)
	c.wake = make(chan struct{})
}

// waitedFor is how long the process's output has waited for credit, the
// current wait included.
func (c *outputCredit) waitedFor() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting > 0 {
		return c.waited + time.Since(c.since)
	}
	return c.waited
}

// credit gives process id more output credit (protocol.AgentMethodCredit).
func (t *processTable) credit(p protocol.CreditParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	proc, err := t.lookup(p.ID)
	if err != nil {
		return err
	}
	proc.credit.add(p.Bytes)
	return nil
}

// unlimitAll lifts every process's flow control (shutdown).
func (t *processTable) unlimitAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.byID {
		p.credit.unlimit()
	}
}
