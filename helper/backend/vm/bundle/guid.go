package bundle

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// GUID is a GPT GUID in its on-disk byte order: the first three fields
// little-endian, the last two as bytes (UEFI spec, appendix A).
type GUID [16]byte

// Partition type GUIDs this package names. Only the Linux root type of
// the helper's architecture (LinuxRootX86_64, LinuxRootARM64) takes part
// in choosing the root; the others make Partition.TypeName readable in
// logs.
var (
	LinuxRootX86_64 = MustParseGUID("4f68bce3-e8cd-4db1-96e7-fbcaf984b709")
	LinuxRootARM64  = MustParseGUID("b921b045-1df0-41c3-af44-4c6f280d3fae")
	LinuxFilesystem = MustParseGUID("0fc63daf-8483-4772-8e79-3d69d8477de4")
	EFISystem       = MustParseGUID("c12a7328-f81f-11d2-ba4b-00a0c93ec93b")
	BIOSBoot        = MustParseGUID("21686148-6449-6e6f-744e-656564454649")
	LinuxSwap       = MustParseGUID("0657fd6d-a4ab-43c4-84e5-0933c84b4f4f")
)

var guidNames = map[GUID]string{
	LinuxRootX86_64: LinuxRootX86_64Name,
	LinuxRootARM64:  LinuxRootARM64Name,
	LinuxFilesystem: "Linux filesystem",
	EFISystem:       "EFI system",
	BIOSBoot:        "BIOS boot",
	LinuxSwap:       "Linux swap",
}

// ParseGUID reads the textual form 8-4-4-4-12 (hex, either case).
func ParseGUID(s string) (GUID, error) {
	var g GUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return g, fmt.Errorf("GUID %q: not in the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", s)
	}
	var raw [16]byte
	hexDigits := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(raw[:], []byte(hexDigits)); err != nil {
		return g, fmt.Errorf("GUID %q: %w", s, err)
	}
	binary.LittleEndian.PutUint32(g[0:4], binary.BigEndian.Uint32(raw[0:4]))
	binary.LittleEndian.PutUint16(g[4:6], binary.BigEndian.Uint16(raw[4:6]))
	binary.LittleEndian.PutUint16(g[6:8], binary.BigEndian.Uint16(raw[6:8]))
	copy(g[8:], raw[8:])
	return g, nil
}

// MustParseGUID is ParseGUID for constants; it panics on a malformed one.
func MustParseGUID(s string) GUID {
	g, err := ParseGUID(s)
	if err != nil {
		panic(err)
	}
	return g
}

// String is the textual form, lower case.
func (g GUID) String() string {
	return fmt.Sprintf("%08x-%04x-%04x-%x-%x",
		binary.LittleEndian.Uint32(g[0:4]),
		binary.LittleEndian.Uint16(g[4:6]),
		binary.LittleEndian.Uint16(g[6:8]),
		g[8:10], g[10:16])
}

// IsZero reports the all-zero GUID, which marks an unused GPT entry.
func (g GUID) IsZero() bool { return g == GUID{} }
