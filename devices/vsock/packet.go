package vsock

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderSize is the size of struct virtio_vsock_hdr on the wire.
const HeaderSize = 44

// HostCID is the context id of the host, as seen by the guest.
const HostCID = 2

// MaxPacketData is the largest payload one packet may carry. Linux never sends
// more than 64 KiB in one packet (VIRTIO_VSOCK_MAX_PKT_BUF_SIZE); a larger len
// from the guest is refused before anything is read or allocated.
const MaxPacketData = 64 << 10

// Socket type carried in Header.Type. Only stream sockets are supported.
const TypeStream uint16 = 1

// Operations carried in Header.Op.
const (
	OpRequest       uint16 = 1 // open a connection
	OpResponse      uint16 = 2 // accept a connection
	OpRST           uint16 = 3 // refuse or abort a connection
	OpShutdown      uint16 = 4 // half- or full-close (see the Shutdown* flags)
	OpRW            uint16 = 5 // stream data
	OpCreditUpdate  uint16 = 6 // here is my buf_alloc and fwd_cnt
	OpCreditRequest uint16 = 7 // please send me a credit update
)

// Flags of an OpShutdown packet.
const (
	ShutdownRcv  uint32 = 1 // the sender will receive no more data
	ShutdownSend uint32 = 2 // the sender will send no more data
	shutdownBoth        = ShutdownRcv | ShutdownSend
)

// Header is struct virtio_vsock_hdr (all fields little-endian on the wire).
type Header struct {
	SrcCID   uint64
	DstCID   uint64
	SrcPort  uint32
	DstPort  uint32
	Len      uint32 // payload bytes following the header (OpRW only)
	Type     uint16
	Op       uint16
	Flags    uint32
	BufAlloc uint32 // sender's receive buffer size
	FwdCnt   uint32 // bytes the sender has consumed from its receive buffer
}

// Errors returned by Header.Validate; callers may test them with errors.Is.
var (
	ErrShortHeader   = errors.New("vsock: packet shorter than its 44-byte header")
	ErrPacketTooLong = errors.New("vsock: packet payload longer than the maximum")
	ErrBadType       = errors.New("vsock: socket type is not STREAM")
	ErrBadOp         = errors.New("vsock: unknown operation")
	ErrBadSrcCID     = errors.New("vsock: source CID is not the guest's")
	ErrBadDstCID     = errors.New("vsock: destination CID is not the host's")
	ErrUnexpectedLen = errors.New("vsock: payload on a packet that is not RW")
	ErrBadFlags      = errors.New("vsock: unknown shutdown flags")
)

// Encode writes h into b, which must be at least HeaderSize bytes long.
func (h Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	le := binary.LittleEndian
	le.PutUint64(b[0:], h.SrcCID)
	le.PutUint64(b[8:], h.DstCID)
	le.PutUint32(b[16:], h.SrcPort)
	le.PutUint32(b[20:], h.DstPort)
	le.PutUint32(b[24:], h.Len)
	le.PutUint16(b[28:], h.Type)
	le.PutUint16(b[30:], h.Op)
	le.PutUint32(b[32:], h.Flags)
	le.PutUint32(b[36:], h.BufAlloc)
	le.PutUint32(b[40:], h.FwdCnt)
}

// Bytes returns the 44-byte wire form of h.
func (h Header) Bytes() []byte {
	b := make([]byte, HeaderSize)
	h.Encode(b)
	return b
}

// DecodeHeader parses the first HeaderSize bytes of b. It checks only the
// length; call Validate on the result before trusting any field.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: got %d bytes", ErrShortHeader, len(b))
	}
	le := binary.LittleEndian
	return Header{
		SrcCID:   le.Uint64(b[0:]),
		DstCID:   le.Uint64(b[8:]),
		SrcPort:  le.Uint32(b[16:]),
		DstPort:  le.Uint32(b[20:]),
		Len:      le.Uint32(b[24:]),
		Type:     le.Uint16(b[28:]),
		Op:       le.Uint16(b[30:]),
		Flags:    le.Uint32(b[32:]),
		BufAlloc: le.Uint32(b[36:]),
		FwdCnt:   le.Uint32(b[40:]),
	}, nil
}

// Validate checks a header the guest sent (already copied out of guest
// memory): a stream packet with a known op, from guestCID to the host, whose
// payload is no larger than MaxPacketData and present only on OpRW.
func (h Header) Validate(guestCID uint64) error {
	switch {
	case h.Type != TypeStream:
		return fmt.Errorf("%w: type %d", ErrBadType, h.Type)
	case h.Op < OpRequest || h.Op > OpCreditRequest:
		return fmt.Errorf("%w: op %d", ErrBadOp, h.Op)
	case h.SrcCID != guestCID:
		return fmt.Errorf("%w: src_cid %d, guest is %d", ErrBadSrcCID, h.SrcCID, guestCID)
	case h.DstCID != HostCID:
		return fmt.Errorf("%w: dst_cid %d", ErrBadDstCID, h.DstCID)
	case h.Len > MaxPacketData:
		return fmt.Errorf("%w: len %d > %d", ErrPacketTooLong, h.Len, MaxPacketData)
	case h.Len != 0 && h.Op != OpRW:
		return fmt.Errorf("%w: op %s with len %d", ErrUnexpectedLen, opName(h.Op), h.Len)
	case h.Op == OpShutdown && h.Flags&^shutdownBoth != 0:
		return fmt.Errorf("%w: %#x", ErrBadFlags, h.Flags)
	}
	return nil
}

// String renders h for logs.
func (h Header) String() string {
	return fmt.Sprintf("%s %d:%d->%d:%d len=%d flags=%#x buf_alloc=%d fwd_cnt=%d",
		opName(h.Op), h.SrcCID, h.SrcPort, h.DstCID, h.DstPort, h.Len, h.Flags, h.BufAlloc, h.FwdCnt)
}

func opName(op uint16) string {
	switch op {
	case OpRequest:
		return "REQUEST"
	case OpResponse:
		return "RESPONSE"
	case OpRST:
		return "RST"
	case OpShutdown:
		return "SHUTDOWN"
	case OpRW:
		return "RW"
	case OpCreditUpdate:
		return "CREDIT_UPDATE"
	case OpCreditRequest:
		return "CREDIT_REQUEST"
	}
	return fmt.Sprintf("op(%d)", op)
}
