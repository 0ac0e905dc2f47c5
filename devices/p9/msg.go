package p9

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hugelgupf/p9/linux"
)

// A 9P message on the wire: size[4] type[1] tag[2] body[size-7], little
// endian. This file holds the little of the codec the device needs itself:
// the header, a structural check of every T-message that mirrors what
// hugelgupf/p9 decodes (so that the server never fails to decode what we
// hand it — a decode failure there is answered with NOTAG and could not be
// routed back to its chain), and the replies the device writes on its own.

const (
	headerSize = 7
	noTag      = 0xFFFF
	noFid      = 0xFFFFFFFF

	// maxServerMessage is hugelgupf/p9's own limit (maximumLength): a
	// larger message would end its connection.
	maxServerMessage = 4 << 20
	// minMessageSize is the smallest msize we accept in Tversion.
	minMessageSize = 4096
	// rlerrorSize is the size of an Rlerror reply.
	rlerrorSize = headerSize + 4
	// twriteFixedSize is Twrite's body before its data: fid[4] offset[8]
	// count[4].
	twriteFixedSize = 16
	// treaddirCountOffset is where count sits in Treaddir's body: fid[4]
	// offset[8] count[4].
	treaddirCountOffset = 12
	// rreaddirHeaderSize is Rreaddir before its entries: header, count[4].
	rreaddirHeaderSize = headerSize + 4
)

// Message types the device looks at.
const (
	msgRlerror      = 7
	msgTstatfs      = 8
	msgTlopen       = 12
	msgTlcreate     = 14
	msgTsymlink     = 16
	msgTmknod       = 18
	msgTrename      = 20
	msgTreadlink    = 22
	msgTgetattr     = 24
	msgTsetattr     = 26
	msgTxattrwalk   = 30
	msgTxattrcreate = 32
	msgTreaddir     = 40
	msgTfsync       = 50
	msgTlock        = 52
	msgTgetlock     = 54
	msgRgetlock     = 55
	msgTlink        = 70
	msgTmkdir       = 72
	msgTrenameat    = 74
	msgTunlinkat    = 76
	msgTversion     = 100
	msgRversion     = 101
	msgTauth        = 102
	msgTattach      = 104
	msgTflush       = 108
	msgTwalk        = 110
	msgTread        = 116
	msgTwrite       = 118
	msgTclunk       = 120
	msgTremove      = 122
	msgTwalkgetattr = 126
	msgTucreate     = 128
	msgTumkdir      = 130
	msgTumknod      = 132
	msgTusymlink    = 134
)

// layouts gives, per T-message the server understands, its body as field
// codes: '1' '2' '4' '8' fixed-size integers, 's' a string (u16 length +
// bytes), 'W' walk names (u16 count + strings), 'P' Twrite's count (u32)
// followed by exactly count bytes of data. Mirrors hugelgupf/p9's decoders.
var layouts = map[uint8]string{
	msgTstatfs:      "4",
	msgTlopen:       "44",
	msgTlcreate:     "4s444",
	msgTsymlink:     "4ss4",
	msgTmknod:       "4s4444",
	msgTrename:      "44s",
	msgTreadlink:    "4",
	msgTgetattr:     "48",
	msgTsetattr:     "44444" + "88888",
	msgTxattrwalk:   "44s",
	msgTxattrcreate: "4s84",
	msgTreaddir:     "484",
	msgTfsync:       "4",
	msgTlock:        "414884s",
	msgTgetlock:     "41884s",
	msgTlink:        "44s",
	msgTmkdir:       "4s44",
	msgTrenameat:    "4s4s",
	msgTunlinkat:    "4s4",
	msgTversion:     "4s",
	msgTauth:        "4ss4",
	msgTattach:      "44ss4",
	msgTflush:       "2",
	msgTwalk:        "44W",
	msgTread:        "484",
	msgTwrite:       "48P",
	msgTclunk:       "4",
	msgTremove:      "4",
	msgTwalkgetattr: "44W",
	msgTucreate:     "4s4444",
	msgTumkdir:      "4s444",
	msgTumknod:      "4s44444",
	msgTusymlink:    "4ss44",
}

// errMalformed is wrapped by checkBody's errors.
var errMalformed = errors.New("malformed 9P message")

// header is a decoded message header.
type header struct {
	size uint32
	typ  uint8
	tag  uint16
}

func parseHeader(b []byte) header {
	return header{
		size: binary.LittleEndian.Uint32(b[0:4]),
		typ:  b[4],
		tag:  binary.LittleEndian.Uint16(b[5:7]),
	}
}

// checkBody verifies that body decodes completely as a message of type typ.
// It returns linux.EOPNOTSUPP for a type the server does not serve and an
// error wrapping errMalformed for a body that is short or inconsistent.
func checkBody(typ uint8, body []byte) error {
	layout, ok := layouts[typ]
	if !ok {
		return linux.EOPNOTSUPP
	}
	off := 0
	need := func(n int) bool {
		if n > len(body)-off {
			return false
		}
		off += n
		return true
	}
	str := func() bool {
		if !need(2) {
			return false
		}
		return need(int(binary.LittleEndian.Uint16(body[off-2:])))
	}
	for _, code := range []byte(layout) {
		ok := true
		switch code {
		case '1':
			ok = need(1)
		case '2':
			ok = need(2)
		case '4':
			ok = need(4)
		case '8':
			ok = need(8)
		case 's':
			ok = str()
		case 'W':
			if ok = need(2); ok {
				n := int(binary.LittleEndian.Uint16(body[off-2:]))
				for i := 0; i < n && ok; i++ {
					ok = str()
				}
			}
		case 'P':
			if ok = need(4); ok {
				count := binary.LittleEndian.Uint32(body[off-4:])
				ok = uint64(count) == uint64(len(body)-off)
				off = len(body)
			}
		}
		if !ok {
			return fmt.Errorf("%w: type %d body of %d bytes ends inside field %d (%q)", errMalformed, typ, len(body), off, code)
		}
	}
	return nil
}

func u32(b []byte, off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }

// rlerror encodes an Rlerror reply.
func rlerror(tag uint16, errno linux.Errno) []byte {
	b := make([]byte, rlerrorSize)
	binary.LittleEndian.PutUint32(b[0:], rlerrorSize)
	b[4] = msgRlerror
	binary.LittleEndian.PutUint16(b[5:], tag)
	binary.LittleEndian.PutUint32(b[7:], uint32(errno))
	return b
}

// lockTypeUnlocked is P9_LOCK_TYPE_UNLCK.
const lockTypeUnlocked = 2

// rgetlockNoConflict answers a (validated) Tgetlock body: no lock on the
// host conflicts; the rest of the request is echoed as the protocol wants.
func rgetlockNoConflict(tag uint16, body []byte) []byte {
	// Tgetlock: fid[4] type[1] start[8] length[8] proc_id[4] client_id[s]
	// Rgetlock: type[1] start[8] length[8] proc_id[4] client_id[s]
	rest := body[5:] // start onwards, already validated
	size := headerSize + 1 + len(rest)
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b[0:], uint32(size))
	b[4] = msgRgetlock
	binary.LittleEndian.PutUint16(b[5:], tag)
	b[7] = lockTypeUnlocked
	copy(b[8:], rest)
	return b
}

// tclunk encodes a Tclunk of fid (sent by the device itself at reset).
func tclunk(tag uint16, fid uint32) []byte {
	b := make([]byte, headerSize+4)
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)))
	b[4] = msgTclunk
	binary.LittleEndian.PutUint16(b[5:], tag)
	binary.LittleEndian.PutUint32(b[7:], fid)
	return b
}

// xattrwalkName returns the name of a validated Txattrwalk body.
func xattrwalkName(body []byte) string {
	n := int(binary.LittleEndian.Uint16(body[8:10]))
	return string(body[10 : 10+n])
}
