package embedded

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ErrNotEmbedded is returned by Kernel when the binary carries no kernel.
var ErrNotEmbedded = errors.New("no guest kernel embedded in this binary (built without the embedkernel tag; `make build` embeds one when `make kernel` has built it)")

// maxKernelSize bounds the decompressed kernel: our vmlinux is ~17 MiB.
const maxKernelSize = 256 << 20

// Available reports whether a kernel is embedded.
func Available() bool { return len(compressed) > 0 }

// Kernel returns the embedded kernel (vmlinux on amd64, an Image on
// arm64), decompressed (a fresh slice on every call), or ErrNotEmbedded.
func Kernel() ([]byte, error) {
	return decompress(compressed)
}

// decompress gunzips gz, refusing output beyond maxKernelSize.
func decompress(gz []byte) ([]byte, error) {
	if len(gz) == 0 {
		return nil, ErrNotEmbedded
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("embedded kernel: %w", err)
	}
	var out bytes.Buffer
	out.Grow(min(len(gz)*4, maxKernelSize))
	n, err := io.Copy(&out, io.LimitReader(zr, maxKernelSize+1))
	if err != nil {
		return nil, fmt.Errorf("embedded kernel: decompressing: %w", err)
	}
	if n > maxKernelSize {
		return nil, fmt.Errorf("embedded kernel: larger than %d MiB decompressed", maxKernelSize>>20)
	}
	return out.Bytes(), nil
}

// Unpack writes the embedded kernel, decompressed, into dir (created 0700
// if missing) unless an earlier start already did, and returns its path.
// Starts after the first then map that file rather than inflate ~17 MiB
// on every start. The file is named by the image's gzip trailer (the CRC-32
// and length of the kernel, checked when it is unpacked) and the
// compressed length, so a rebuilt binary never takes another build's
// kernel, and finding the file costs no pass over the image (hashing the
// 3.5 MiB image took half a second of a nested start). It is written
// to a temporary name and renamed, so a crash never leaves half a kernel
// under the final name.
func Unpack(dir string) (string, error) {
	return unpack(compressed, dir)
}

func unpack(gz []byte, dir string) (string, error) {
	if len(gz) == 0 {
		return "", ErrNotEmbedded
	}
	crc, want, ok := gzipTrailer(gz)
	if !ok {
		return "", errors.New("embedded kernel: truncated gzip image")
	}
	path := filepath.Join(dir, fmt.Sprintf("vmlinux-%08x-%08x-%x", crc, want, len(gz)))
	if info, err := os.Stat(path); err == nil && info.Mode().IsRegular() && uint32(info.Size()) == want {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("embedded kernel: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".vmlinux-*")
	if err != nil {
		return "", fmt.Errorf("embedded kernel: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		tmp.Close()
		return "", fmt.Errorf("embedded kernel: %w", err)
	}
	n, err := io.Copy(tmp, io.LimitReader(zr, maxKernelSize+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return "", fmt.Errorf("embedded kernel: unpacking to %s: %w", dir, err)
	case n > maxKernelSize:
		return "", fmt.Errorf("embedded kernel: larger than %d MiB decompressed", maxKernelSize>>20)
	case uint32(n) != want:
		return "", fmt.Errorf("embedded kernel: decompressed to %d bytes, its gzip trailer says %d", n, want)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", fmt.Errorf("embedded kernel: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("embedded kernel: %w", err)
	}
	return path, nil
}

// gzipTrailer is a gzip member's trailer: the CRC-32 of its data and
// ISIZE, its length mod 2³².
func gzipTrailer(gz []byte) (crc, size uint32, ok bool) {
	if len(gz) < 18 { // 10-byte header, 8-byte trailer
		return 0, 0, false
	}
	t := gz[len(gz)-8:]
	return binary.LittleEndian.Uint32(t), binary.LittleEndian.Uint32(t[4:]), true
}
