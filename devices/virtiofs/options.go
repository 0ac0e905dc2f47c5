package virtiofs

import (
	"log/slog"

	"github.com/cowork-vmm/cowork-vmm/devices/hostfs"
)

// MaxTagLen is the length of the config space's tag field (virtio 1.2
// §5.11.4): a tag of exactly 36 bytes has no NUL.
const MaxTagLen = 36

// Defaults for Options' zero values. DefaultQueueSize leaves room for the
// largest request: Linux's driver caps a request's pages at the queue size
// less 4 descriptors for its headers, so 256 entries would cut each 1 MiB
// READ or WRITE into 1008 KiB and 16 KiB, twice the requests (and each
// request, nested, costs a millisecond or more).
const (
	DefaultQueueSize   = 1024
	DefaultMaxInFlight = 16
	DefaultMaxNodes    = 1 << 18
	DefaultMaxHandles  = 1 << 14
)

// Options configure a Device.
type Options struct {
	// Tag is the mount tag the guest names (mount -t virtiofs TAG dir),
	// 1..MaxTagLen bytes.
	Tag string
	// Root serves the device's tree: its Root is the directory the guest
	// mounts (a *hostfs.Exports: one name per export). Required.
	Root Tree
	// Cached says the files under Root do not change behind the guest's
	// back (the system directories): the guest keeps entries, attributes
	// and page cache for a long time. Otherwise entries and attributes
	// live CoherentTimeout and every open drops the page cache, so the
	// guest sees host edits (see CoherentTimeout).
	Cached bool
	// NoOpen makes the guest open files without asking the device (FUSE's
	// "no open", see fileSystem.Open): no OPEN or RELEASE round trip for
	// each file a program opens. Only for a Cached device whose exports
	// are all read-only (the system directories): a file opened so is
	// read through its node, and a WRITE to it fails with EBADF.
	NoOpen bool
	// ListNamesOnly makes the guest list directories with READDIR (names
	// and types) instead of READDIRPLUS (every entry looked up on the
	// host, with its attributes). For directories programs list far more
	// than they stat: interpreters scan the system directories for their
	// modules, and stat only the names they import.
	ListNamesOnly bool
	// Logger receives the device's log (rate-limited guest misbehaviour).
	// nil = slog.Default().
	Logger *slog.Logger
	// QueueSize is the largest size of each queue (a power of two); 0 =
	// DefaultQueueSize.
	QueueSize uint16
	// MaxInFlight bounds the requests served at once; 0 =
	// DefaultMaxInFlight.
	MaxInFlight int
	// MaxNodes bounds the inodes the guest may hold (table entries); a
	// lookup beyond it fails with ENFILE. 0 = DefaultMaxNodes. The host
	// descriptors behind nodes, handles and readers are bounded by the
	// Root's own budget (hostfs.NewExportsWithin), whatever these bounds.
	MaxNodes int
	// MaxHandles bounds the files and directories the guest may hold open
	// (table entries); 0 = DefaultMaxHandles.
	MaxHandles int
}

// Tree is what a device serves: the export layer's registry of exports
// (*hostfs.Exports).
type Tree interface {
	// Root returns the directory the guest mounts, for one session.
	Root() hostfs.Node
	// SyncWritable flushes the host file systems under the writable
	// exports (the guest's sync(2)).
	SyncWritable() error
}
