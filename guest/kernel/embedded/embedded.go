package embedded

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
)

// ErrNotEmbedded is returned by Kernel when the binary carries no kernel.
var ErrNotEmbedded = errors.New("no guest kernel embedded in this binary (built without the embedkernel tag; `make build` embeds one when `make kernel` has built it)")

// maxKernelSize bounds the decompressed kernel: our vmlinux is ~17 MiB.
const maxKernelSize = 256 << 20

// Available reports whether a kernel is embedded.
func Available() bool { return len(compressed) > 0 }

// Kernel returns the embedded vmlinux, decompressed (a fresh slice on every
// call), or ErrNotEmbedded.
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
