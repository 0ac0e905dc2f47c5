// Package splice copies bytes both ways between two connections until both
// directions end or the pair has been idle too long. The guest proxy and the
// helper's egress server both use it.
package splice

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// closeWriter is implemented by TCP, Unix and vsock connections: it sends
// EOF to the peer while the other direction keeps flowing.
type closeWriter interface{ CloseWrite() error }

// Pair copies a→b and b→a. aReader, if not nil, is read instead of a (a
// buffered reader that may already hold bytes of a). The pair is idle when
// neither direction moved a byte for idle; then both are closed. When one
// direction reaches EOF its destination gets CloseWrite if it supports it,
// otherwise both connections are closed (a half-open net.Pipe would hang).
// Pair returns when both directions ended; it closes both connections.
func Pair(a net.Conn, aReader io.Reader, b net.Conn, idle time.Duration) {
	if aReader == nil {
		aReader = a
	}
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var closeOnce sync.Once
	closeBoth := func() {
		closeOnce.Do(func() {
			a.Close()
			b.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); copyIdle(b, aReader, a, idle, &last, closeBoth) }()
	go func() { defer wg.Done(); copyIdle(a, b, b, idle, &last, closeBoth) }()
	wg.Wait()
	closeBoth()
}

// copyIdle copies src to dst, refreshing the shared activity clock; a read
// deadline that expires while the other direction was active is extended.
func copyIdle(dst net.Conn, src io.Reader, srcConn net.Conn, idle time.Duration, last *atomic.Int64, closeBoth func()) {
	buf := make([]byte, 32*1024)
	for {
		if idle > 0 {
			deadline := time.Unix(0, last.Load()).Add(idle)
			if err := srcConn.SetReadDeadline(deadline); err != nil {
				closeBoth()
				return
			}
		}
		n, err := src.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			if _, werr := dst.Write(buf[:n]); werr != nil {
				closeBoth()
				return
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && idle > 0 &&
			time.Since(time.Unix(0, last.Load())) < idle {
			continue // the other direction was busy: not idle
		}
		if errors.Is(err, io.EOF) {
			if cw, ok := dst.(closeWriter); ok && cw.CloseWrite() == nil {
				return
			}
		}
		closeBoth()
		return
	}
}
