package virtiofs

import (
	"fmt"
	"io"

	"github.com/cowork-vmm/cowork-vmm/devices/virtio"
)

// message is one chain as the protocol server sees it: the request's
// bytes (in) and the room for the reply (out), each a list of byte
// slices. Zero-copy: when guest memory can be mapped (virtio.Slicer), the
// slices are the chain's guest buffers themselves, so a READ's pread and
// a WRITE's pwrite move data between the host file and guest memory with
// no copy. Otherwise (or when a buffer does not lie in one piece of RAM)
// the request is copied into a bounce buffer and the reply built in
// another (bounce), which handle then copies into the chain.
//
// Guest buffers stay guest-writable while the server reads them: go-fuse
// copies the header and fixed arguments out before it checks them, and
// names become Go strings (copies) before they are used, so a guest
// changing its buffers mid-request changes only its own data.
type message struct {
	in, out [][]byte
	bounce  []byte // the reply's bytes when out is not guest memory
}

// message maps or copies chain's buffers. out is at most maxMessage bytes,
// whatever the chain offers (the server never needs more).
func (s *session) message(chain *virtio.Chain) (message, error) {
	if s.slicer != nil {
		if m, ok := s.mapped(chain); ok {
			return m, nil
		}
	}
	in := make([]byte, chain.ReadableLen())
	if _, err := io.ReadFull(chain.Reader(), in); err != nil {
		return message{}, fmt.Errorf("copying the request: %w", err)
	}
	out := make([]byte, min(chain.WritableLen(), maxMessage))
	return message{in: [][]byte{in}, out: [][]byte{out}, bounce: out}, nil
}

// mapped returns the chain's buffers as guest memory; false if one of
// them cannot be mapped.
func (s *session) mapped(chain *virtio.Chain) (message, bool) {
	readable, writable := chain.Readable(), chain.Writable()
	m := message{in: make([][]byte, 0, len(readable)), out: make([][]byte, 0, len(writable))}
	for _, b := range readable {
		p, err := s.slicer.Slice(b.Addr, uint64(b.Len))
		if err != nil {
			return message{}, false
		}
		m.in = append(m.in, p)
	}
	room := uint32(maxMessage)
	for _, b := range writable {
		if room == 0 {
			break
		}
		n := min(b.Len, room)
		p, err := s.slicer.Slice(b.Addr, uint64(n))
		if err != nil {
			return message{}, false
		}
		m.out = append(m.out, p)
		room -= n
	}
	return m, true
}
