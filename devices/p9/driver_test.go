package p9

import (
	"testing"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio/virtiotest"
)

func vtReadable(p []byte) virtiotest.Buffer { return virtiotest.Readable(p) }
func vtWritable(n uint32) virtiotest.Buffer { return virtiotest.Writable(n) }

func newDriverFor(t *testing.T, dev *Device) *virtiotest.Driver {
	t.Helper()
	return virtiotest.Start(t, dev, virtiotest.Options{MemSize: 16 << 20})
}
