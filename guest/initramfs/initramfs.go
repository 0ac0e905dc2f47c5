package initramfs

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// File is one entry of an archive.
//
// The entry's type comes from Mode: a zero type is a regular file whose
// content is Data, or, when HostPath is set, the content of that host file;
// fs.ModeDir is a directory; fs.ModeSymlink a symbolic link to Target;
// fs.ModeDevice (plus fs.ModeCharDevice for a character device) a device
// node numbered Major:Minor. Permission, setuid, setgid and sticky bits are
// kept. Owners are always root and timestamps always zero.
type File struct {
	// Path inside the archive, e.g. "init" or "/bin/sh"; a leading slash is
	// ignored. It may not be empty, "." or contain "..".
	Path     string
	Mode     fs.FileMode
	Data     []byte
	HostPath string
	Target   string
	Major    uint32
	Minor    uint32
}

// cpio (and <sys/stat.h>) file type bits.
const (
	modeTypeRegular   = 0o100000
	modeTypeDirectory = 0o040000
	modeTypeSymlink   = 0o120000
	modeTypeCharDev   = 0o020000
	modeTypeBlockDev  = 0o060000
	modeSetuid        = 0o4000
	modeSetgid        = 0o2000
	modeSticky        = 0o1000

	newcMagic   = "070701"
	trailerName = "TRAILER!!!"
	// maxFileSize is what the 8-hex-digit size field of a newc header can hold.
	maxFileSize = 1<<32 - 1
)

// Write writes files to w as an uncompressed newc cpio archive, with every
// missing parent directory added (mode 0755) before its first child.
func Write(w io.Writer, files []File) error {
	entries, err := plan(files)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	aw := archiveWriter{w: bw}
	for i, e := range entries {
		if err := aw.writeEntry(uint32(i+1), e); err != nil {
			return fmt.Errorf("initramfs: %s: %w", e.name, err)
		}
	}
	if err := aw.writeTrailer(); err != nil {
		return fmt.Errorf("initramfs: trailer: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return nil
}

// Size returns the length of the archive Write would write for files,
// without reading any host file (their sizes come from stat): the VMM
// reserves that much guest memory, then streams the archive into it.
func Size(files []File) (int64, error) {
	entries, err := plan(files)
	if err != nil {
		return 0, err
	}
	aw := archiveWriter{w: io.Discard, sizeOnly: true}
	for i, e := range entries {
		if err := aw.writeEntry(uint32(i+1), e); err != nil {
			return 0, fmt.Errorf("initramfs: %s: %w", e.name, err)
		}
	}
	if err := aw.writeTrailer(); err != nil {
		return 0, fmt.Errorf("initramfs: trailer: %w", err)
	}
	return aw.written, nil
}

// WriteGzip is Write with gzip compression at level (gzip.BestSpeed ..
// gzip.BestCompression, or gzip.DefaultCompression), the format Linux
// unpacks when built with CONFIG_RD_GZIP.
func WriteGzip(w io.Writer, files []File, level int) error {
	zw, err := gzip.NewWriterLevel(w, level)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := Write(zw, files); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("initramfs: gzip: %w", err)
	}
	return nil
}

// entry is a validated File with its archive name and cpio mode.
type entry struct {
	name string
	mode uint32
	file File
}

// plan validates files, adds implicit parent directories and rejects
// duplicates. Explicit directories may be listed after their children; the
// explicit mode then replaces the implicit 0755.
func plan(files []File) ([]entry, error) {
	var entries []entry
	index := make(map[string]int) // archive name -> position in entries
	implicit := make(map[string]bool)
	for _, f := range files {
		name, err := cleanName(f.Path)
		if err != nil {
			return nil, err
		}
		mode, err := cpioMode(f)
		if err != nil {
			return nil, fmt.Errorf("initramfs: %s: %w", name, err)
		}
		// Parents first.
		for _, dir := range parents(name) {
			if i, ok := index[dir]; ok {
				if entries[i].mode&0o170000 != modeTypeDirectory {
					return nil, fmt.Errorf("initramfs: %s: parent %s is not a directory", name, dir)
				}
				continue
			}
			index[dir] = len(entries)
			implicit[dir] = true
			entries = append(entries, entry{name: dir, mode: modeTypeDirectory | 0o755, file: File{Path: dir, Mode: fs.ModeDir | 0o755}})
		}
		if i, ok := index[name]; ok {
			if implicit[name] && mode&0o170000 == modeTypeDirectory {
				implicit[name] = false
				entries[i] = entry{name: name, mode: mode, file: f}
				continue
			}
			return nil, fmt.Errorf("initramfs: %s listed twice", name)
		}
		index[name] = len(entries)
		entries = append(entries, entry{name: name, mode: mode, file: f})
	}
	return entries, nil
}

// cleanName turns a File.Path into the archive's relative name.
func cleanName(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("initramfs: path %q contains NUL", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("initramfs: path %q contains ..", p)
		}
	}
	name := strings.TrimPrefix(path.Clean("/"+p), "/")
	if name == "" || name == "." {
		return "", fmt.Errorf("initramfs: path %q names the archive root", p)
	}
	return name, nil
}

// parents lists the ancestors of name, outermost first ("a/b/c" -> a, a/b).
func parents(name string) []string {
	var dirs []string
	for i := 0; i < len(name); i++ {
		if name[i] == '/' {
			dirs = append(dirs, name[:i])
		}
	}
	return dirs
}

func cpioMode(f File) (uint32, error) {
	if stray := f.Mode &^ (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky | fs.ModeType); stray != 0 {
		return 0, fmt.Errorf("mode %o has bits beyond permissions and type (use fs.ModeSetuid etc. for 0o7000)", uint32(stray))
	}
	m := uint32(f.Mode.Perm())
	if f.Mode&fs.ModeSetuid != 0 {
		m |= modeSetuid
	}
	if f.Mode&fs.ModeSetgid != 0 {
		m |= modeSetgid
	}
	if f.Mode&fs.ModeSticky != 0 {
		m |= modeSticky
	}
	typ := f.Mode.Type()
	switch {
	case typ == 0:
		if f.Data != nil && f.HostPath != "" {
			return 0, errors.New("both Data and HostPath set")
		}
		return m | modeTypeRegular, nil
	case typ == fs.ModeDir:
		return m | modeTypeDirectory, nil
	case typ == fs.ModeSymlink:
		if f.Target == "" {
			return 0, errors.New("symlink without a Target")
		}
		return m | modeTypeSymlink, nil
	case typ == fs.ModeDevice|fs.ModeCharDevice:
		return m | modeTypeCharDev, nil
	case typ == fs.ModeDevice:
		return m | modeTypeBlockDev, nil
	default:
		return 0, fmt.Errorf("unsupported file type %v", typ)
	}
}

type archiveWriter struct {
	w       io.Writer
	written int64
	// sizeOnly counts host files' contents from their size, unread.
	sizeOnly bool
}

func (a *archiveWriter) write(p []byte) error {
	n, err := a.w.Write(p)
	a.written += int64(n)
	return err
}

func (a *archiveWriter) pad() error {
	if rem := a.written % 4; rem != 0 {
		return a.write(make([]byte, 4-rem))
	}
	return nil
}

func (a *archiveWriter) header(ino, mode, nlink uint32, size int64, major, minor uint32, name string) error {
	if size > maxFileSize {
		return fmt.Errorf("size %d exceeds the newc limit of 4 GiB", size)
	}
	hdr := fmt.Sprintf("%s%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		newcMagic, ino, mode, 0, 0, nlink, 0, uint32(size), 0, 0, major, minor, len(name)+1, 0)
	if err := a.write([]byte(hdr)); err != nil {
		return err
	}
	if err := a.write(append([]byte(name), 0)); err != nil {
		return err
	}
	return a.pad()
}

func (a *archiveWriter) writeEntry(ino uint32, e entry) error {
	f := e.file
	switch e.mode & 0o170000 {
	case modeTypeDirectory:
		return a.header(ino, e.mode, 2, 0, 0, 0, e.name)
	case modeTypeSymlink:
		if err := a.header(ino, e.mode, 1, int64(len(f.Target)), 0, 0, e.name); err != nil {
			return err
		}
		if err := a.write([]byte(f.Target)); err != nil {
			return err
		}
		return a.pad()
	case modeTypeCharDev, modeTypeBlockDev:
		return a.header(ino, e.mode, 1, 0, f.Major, f.Minor, e.name)
	}
	if f.HostPath == "" {
		if err := a.header(ino, e.mode, 1, int64(len(f.Data)), 0, 0, e.name); err != nil {
			return err
		}
		if err := a.write(f.Data); err != nil {
			return err
		}
		return a.pad()
	}
	src, err := os.Open(f.HostPath)
	if err != nil {
		return err
	}
	defer src.Close()
	info, err := src.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("host file %s is not a regular file", f.HostPath)
	}
	size := info.Size()
	if err := a.header(ino, e.mode, 1, size, 0, 0, e.name); err != nil {
		return err
	}
	if a.sizeOnly {
		a.written += size
		return a.pad()
	}
	n, err := io.CopyN(a.w, src, size)
	a.written += n
	if err != nil {
		return fmt.Errorf("copying %s (it changed while being read?): %w", f.HostPath, err)
	}
	return a.pad()
}

func (a *archiveWriter) writeTrailer() error {
	return a.header(0, 0, 1, 0, 0, 0, trailerName)
}
