package doctor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel"
)

const kernelFix = "build it: `make kernel` in the cowork-vmm repository (needs apt packages linux-source-6.1 bc flex bison libelf-dev libssl-dev cpio; ~5 min), " +
	"then `make build` embeds it in the binary; or set " + kernel.Env + " to a vmlinux built from guest/kernel/guest.fragment"

// kernelCheck locates the guest kernel as the kvm backend does
// (kernel.Locate, on this Host) and reads its version.
// builtInGuest says what the kvm backend boots: this kernel, over the
// client's VM bundle image or the host's directories (the guest-userland
// check says which, per profile).
const builtInGuest = "; the guest is this kernel over the client's VM bundle image (its rootfs.img, with each profile's changes " +
	"in a copy-on-write layer) when it can be booted, else over the host's system directories with each profile's changes on its root disk"

func (r *runner) kernelCheck() bool {
	h := r.h
	c := Check{ID: CheckKernel, Group: GroupCoworkVMM, Title: "Guest kernel"}
	defer func() { r.add(c) }()
	exe, _ := h.Executable()
	img, err := kernel.Locate(kernel.Sources{
		Override: h.Getenv(kernel.Env),
		Embedded: func() (kernel.Image, error) {
			b, err := h.EmbeddedKernel()
			return kernel.Image{Bytes: b, From: "embedded in this binary"}, err
		},
		Executable: exe,
		Cache:      h.KernelCache,
		Stat:       h.Stat,
	})
	if err != nil {
		c.Status = StatusFail
		c.Detail = err.Error()
		c.Fix = kernelLocateFix(err)
		return false
	}
	var version string
	if img.Bytes != nil {
		version, err = kernelVersion(bytes.NewReader(img.Bytes))
	} else {
		version, err = r.fileKernelVersion(img.Path)
	}
	switch {
	case err != nil:
		c.Status = StatusWarn
		c.Detail = fmt.Sprintf("%s, but reading its version failed: %v", img.From, err)
		c.Fix = "check that it is the vmlinux of a Linux kernel; " + kernelFix
	case version == "":
		c.Status = StatusWarn
		c.Detail = img.From + ", but it carries no Linux version string: is it a Linux kernel?"
		c.Fix = kernelFix
	default:
		c.Status = StatusOK
		c.Detail = fmt.Sprintf("Linux %s, %s", version, img.From) + builtInGuest
	}
	return true
}

// kernelLocateFix is the fix for kernel.Locate's error.
func kernelLocateFix(err error) string {
	switch {
	case errors.Is(err, kernel.ErrOverrideUnusable):
		return "point " + kernel.Env + " at an existing vmlinux file, or unset it to use the embedded or built kernel"
	case errors.Is(err, kernel.ErrEmbeddedDamaged):
		return "rebuild the binary (`make build`) or set " + kernel.Env
	case errors.Is(err, kernel.ErrBesideUnusable):
		return "remove or replace the file beside the executable named in the detail"
	}
	return kernelFix
}

func (r *runner) fileKernelVersion(path string) (string, error) {
	f, err := r.h.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return kernelVersion(f)
}

// Bounds on reading a kernel image for its version.
const (
	maxKernelScan    = 512 << 20 // a vmlinux is ~17 MiB; stop long after
	kernelScanChunk  = 1 << 20
	maxVersionLength = 200
)

var linuxVersionMarker = []byte("Linux version ")

// kernelVersion finds the release in a kernel image: from a bzImage's setup
// header (its kernel_version pointer), else the "Linux version X" banner
// that every vmlinux carries. "" with a nil error means none was found. It
// reads at most maxKernelScan bytes through one fixed buffer.
func kernelVersion(r io.Reader) (string, error) {
	head := make([]byte, 0x10000)
	n, err := io.ReadFull(r, head)
	eof := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if err != nil && !eof {
		return "", err
	}
	head = head[:n]
	if v := bzImageVersion(head); v != "" {
		return v, nil
	}
	if eof {
		return bannerVersion(head), nil
	}
	// Scan on for the banner. The buffer keeps the last `overlap` bytes
	// when it refills, so a banner split across reads is still seen whole.
	overlap := len(linuxVersionMarker) + maxVersionLength
	buf := make([]byte, n, kernelScanChunk+overlap)
	copy(buf, head)
	total := n
	from := 0 // where the next search starts; a pending banner stays in view
	for {
		if i := bytes.Index(buf[from:], linuxVersionMarker); i >= 0 {
			i += from
			if len(buf)-i >= overlap {
				return versionToken(buf[i+len(linuxVersionMarker):]), nil
			}
			from = i // found, but its version may not be complete yet
		} else {
			from = max(0, len(buf)-len(linuxVersionMarker)+1)
		}
		if total >= maxKernelScan {
			return "", nil
		}
		if len(buf) == cap(buf) {
			shift := len(buf) - overlap
			copy(buf, buf[shift:])
			buf = buf[:overlap]
			from = max(0, from-shift)
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		total += m
		if errors.Is(err, io.EOF) {
			return bannerVersion(buf[from:]), nil
		}
		if err != nil {
			return "", err
		}
	}
}

// bannerVersion is the version after the first banner in b, or "".
func bannerVersion(b []byte) string {
	if i := bytes.Index(b, linuxVersionMarker); i >= 0 {
		return versionToken(b[i+len(linuxVersionMarker):])
	}
	return ""
}

// bzImageVersion reads the version string a bzImage's setup header points
// at ("6.1.0 (user@host) #1 …"), or "".
func bzImageVersion(head []byte) string {
	const (
		hdrMagicOff = 0x202
		versionOff  = 0x20e
	)
	if len(head) < versionOff+2 || string(head[hdrMagicOff:hdrMagicOff+4]) != "HdrS" {
		return ""
	}
	ptr := int(binary.LittleEndian.Uint16(head[versionOff:]))
	if ptr == 0 {
		return ""
	}
	at := ptr + 0x200
	if at >= len(head) {
		return ""
	}
	return versionToken(head[at:])
}

// versionToken is the release: printable bytes up to the first space,
// NUL or newline, at most maxVersionLength.
func versionToken(b []byte) string {
	end := 0
	for end < len(b) && end < maxVersionLength {
		ch := b[end]
		if ch <= ' ' || ch >= 0x7f {
			break
		}
		end++
	}
	return string(b[:end])
}

// KernelVersion returns the Linux release of a kernel image (vmlinux or
// bzImage), "" when the image names none.
func KernelVersion(r io.Reader) (string, error) { return kernelVersion(r) }
