package ninep

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kernel command line keys of the 9p throughput mode (key=value words; the
// kernel ignores them, as they name no parameter it knows, and testinit
// reads them from /proc/cmdline).
const (
	// KeyTag is the virtio-9p mount tag; its presence selects the mode.
	KeyTag = "guestboot.9p"
	// KeyAname is the attach name (our device's export name; qemu ignores it).
	KeyAname = "guestboot.9paname"
	// KeyMiB is the file size in MiB.
	KeyMiB = "guestboot.9pmib"
)

const (
	// MountOptions are the 9p mount options for both VMMs: those of our
	// guest agent (guest/agent's ninePOptions), default cache mode (none:
	// every read and write is a 9p request, nothing is cached in the guest).
	MountOptions = "trans=virtio,version=9p2000.L,msize=262144"
	// FileName is the file the guest writes in the mounted directory.
	FileName = "9p-throughput.bin"
	// BlockSize is the size of each write() and read().
	BlockSize = 1 << 20
	// DefaultMiB is the file size when KeyMiB is absent.
	DefaultMiB = 64
	// MaxMiB bounds KeyMiB.
	MaxMiB = 4096
	// Marker starts the result line on the console.
	Marker = "TESTINIT 9P"
)

// Config is the mode's configuration.
type Config struct {
	Tag   string
	Aname string // empty: the attach root
	MiB   int
}

// Cmdline returns the kernel command line words for c.
func (c Config) Cmdline() string {
	words := []string{KeyTag + "=" + c.Tag, KeyMiB + "=" + strconv.Itoa(c.MiB)}
	if c.Aname != "" {
		words = append(words, KeyAname+"="+c.Aname)
	}
	return strings.Join(words, " ")
}

// Validate checks the values a command line word can carry: no spaces or
// commas (mount options are comma-separated) and a size in 1..MaxMiB.
func (c Config) Validate() error {
	if c.Tag == "" || strings.ContainsAny(c.Tag, " ,\t\n") {
		return fmt.Errorf("9p mount tag %q: want a non-empty word without commas", c.Tag)
	}
	if strings.ContainsAny(c.Aname, " ,\t\n") {
		return fmt.Errorf("9p attach name %q: want a word without commas", c.Aname)
	}
	if c.MiB < 1 || c.MiB > MaxMiB {
		return fmt.Errorf("9p file size of %d MiB: want 1..%d", c.MiB, MaxMiB)
	}
	return nil
}

// ParseCmdline reads the mode's configuration from a kernel command line.
// ok is false when the mode is off (no KeyTag word); err is set when it is
// on but a value is bad.
func ParseCmdline(cmdline string) (c Config, ok bool, err error) {
	c.MiB = DefaultMiB
	for _, word := range strings.Fields(cmdline) {
		key, value, _ := strings.Cut(word, "=")
		switch key {
		case KeyTag:
			c.Tag, ok = value, true
		case KeyAname:
			c.Aname = value
		case KeyMiB:
			n, convErr := strconv.Atoi(value)
			if convErr != nil {
				return c, true, fmt.Errorf("%s=%q: not a number", KeyMiB, value)
			}
			c.MiB = n
		}
	}
	if !ok {
		return c, false, nil
	}
	return c, true, c.Validate()
}

// Result is what the guest measured, or why it could not.
type Result struct {
	Bytes int64
	// Write is the time of the write()s, the fsync and the close; Read that
	// of the read()s of a fresh open (the content check is not timed).
	Write, Read time.Duration
	// Msize is the message size the guest negotiated (from /proc/mounts;
	// 0 when unknown).
	Msize int
	// Err is the guest's error; the other fields are then meaningless.
	Err string
}

// WriteMBps and ReadMBps are the throughputs in MB/s (10^6 bytes).
func (r Result) WriteMBps() float64 { return mbps(r.Bytes, r.Write) }

// ReadMBps: see WriteMBps.
func (r Result) ReadMBps() float64 { return mbps(r.Bytes, r.Read) }

func mbps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e6
}

// Line formats r as the console line.
func (r Result) Line() string {
	if r.Err != "" {
		return Marker + " error=" + strconv.Quote(r.Err)
	}
	return fmt.Sprintf("%s bytes=%d write_ns=%d read_ns=%d msize=%d", Marker, r.Bytes, r.Write.Nanoseconds(), r.Read.Nanoseconds(), r.Msize)
}

// ParseLine parses a Line, possibly after other text (a console prefix).
// ok is false when line holds no result; err when it holds a malformed one.
func ParseLine(line string) (r Result, ok bool, err error) {
	i := strings.Index(line, Marker+" ")
	if i < 0 {
		return Result{}, false, nil
	}
	rest := strings.TrimSpace(line[i+len(Marker)+1:])
	if quoted, isErr := strings.CutPrefix(rest, "error="); isErr {
		msg, err := strconv.Unquote(quoted)
		if err != nil {
			return Result{}, true, fmt.Errorf("9p result line %q: bad error text: %w", line, err)
		}
		if msg == "" {
			msg = "empty error"
		}
		return Result{Err: msg}, true, nil
	}
	const all = 1<<4 - 1
	seen := 0 // a bit per key
	for _, field := range strings.Fields(rest) {
		key, value, found := strings.Cut(field, "=")
		if !found {
			return Result{}, true, fmt.Errorf("9p result line %q: field %q is not key=value", line, field)
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 {
			return Result{}, true, fmt.Errorf("9p result line %q: %s=%q is not a count", line, key, value)
		}
		switch key {
		case "bytes":
			r.Bytes, seen = n, seen|1
		case "write_ns":
			r.Write, seen = time.Duration(n), seen|2
		case "read_ns":
			r.Read, seen = time.Duration(n), seen|4
		case "msize":
			r.Msize, seen = int(n), seen|8
		}
	}
	if seen != all {
		return Result{}, true, errors.New("9p result line " + strconv.Quote(line) + ": want bytes, write_ns, read_ns and msize")
	}
	return r, true, nil
}

// FillPattern fills a block with bytes that differ between neighbouring
// offsets (so a shifted or repeated chunk is caught).
func FillPattern(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
}

// StampBlock writes block number n at both ends of b (at least 16 bytes),
// so a block read from the wrong offset is caught.
func StampBlock(b []byte, n int) {
	binary.LittleEndian.PutUint64(b, uint64(n))
	binary.LittleEndian.PutUint64(b[len(b)-8:], ^uint64(n))
}

// BlockStamp reads the number StampBlock wrote at the start of b.
func BlockStamp(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
