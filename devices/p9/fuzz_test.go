package p9

import (
	"encoding/binary"
	"testing"
)

// FuzzDeviceMessage feeds arbitrary bytes as one request chain to a live
// device over a real export. Invariants: the device answers every chain
// (no hang, no panic); a reply fits the writable buffers, its size field
// equals the used length and it carries the request's tag; only a request
// too short to hold a header gets an empty reply.
func FuzzDeviceMessage(f *testing.F) {
	f.Add(message(msgTversion, noTag, cat(le32(8192), str9("9P2000.L"))))
	f.Add(message(msgTattach, 1, cat(le32(1), le32(noFid), str9(""), str9("s"), le32(0))))
	f.Add(message(msgTwalk, 2, cat(le32(1), le32(2), []byte{1, 0}, str9("f"))))
	f.Add(message(msgTwalk, 2, cat(le32(1), le32(2), []byte{1, 0}, str9(".."))))
	f.Add(message(msgTlopen, 3, cat(le32(2), le32(0))))
	f.Add(message(msgTread, 4, cat(le32(2), le64(0), le32(100))))
	f.Add(message(msgTwrite, 5, cat(le32(2), le64(0), le32(3), []byte("abc"))))
	f.Add(message(msgTlcreate, 6, cat(le32(1), str9("new"), le32(2), le32(0o644), le32(0))))
	f.Add(message(msgTreaddir, 7, cat(le32(1), le64(0), le32(4096))))
	f.Add(message(msgTgetlock, 8, cat(le32(1), []byte{1}, le64(0), le64(0), le32(1), str9("g"))))
	f.Add(message(msgTxattrwalk, 9, cat(le32(1), le32(3), str9("user.x"))))
	f.Add(message(msgTflush, 10, []byte{1, 0}))
	f.Add(message(msgTclunk, 11, le32(2)))
	f.Add(message(msgTwrite, 12, cat(le32(2), le64(0), le32(8192-headerSize-twriteFixedSize), make([]byte, 8192-headerSize-twriteFixedSize))))
	f.Add(message(msgTwrite, 13, cat(le32(2), le64(0), le32(8000), make([]byte, 8192-headerSize-twriteFixedSize))))
	f.Add([]byte{7, 0, 0, 0, 200, 1, 0})
	f.Add([]byte{1, 2})

	r := newRig(f, Options{MaxFids: 64})
	r.export(f, "s", false, map[string]string{"f": "content"})
	version(f, r, 8192)

	f.Fuzz(func(t *testing.T, msg []byte) {
		if len(msg) == 0 || len(msg) > 64<<10 {
			return // the driver cannot place an empty buffer; cap the size
		}
		const writable = 4096
		u := r.roundTrip(t, msg, writable)
		if u.Len > writable {
			t.Fatalf("used length %d exceeds the writable %d", u.Len, writable)
		}
		if len(msg) < headerSize {
			if u.Len != 0 {
				t.Fatalf("a %d-byte request got a %d-byte reply", len(msg), u.Len)
			}
			return
		}
		if u.Len < headerSize {
			t.Fatalf("a request with a header got a %d-byte reply", u.Len)
		}
		h := parseHeader(u.Data)
		if h.size != u.Len {
			t.Fatalf("reply size field %d, used length %d", h.size, u.Len)
		}
		if want := binary.LittleEndian.Uint16(msg[5:7]); h.tag != want {
			t.Fatalf("reply tag %d, request tag %d", h.tag, want)
		}
	})
}
