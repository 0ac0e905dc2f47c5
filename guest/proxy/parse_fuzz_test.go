package proxy

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// FuzzReadProxyRequest: whatever a client sends, the parser never panics,
// never reads more than the header limit plus one buffer, and anything it
// accepts is a CONNECT or an absolute http:// request with a target the
// egress frame accepts.
func FuzzReadProxyRequest(f *testing.F) {
	f.Add([]byte("CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n"))
	f.Add([]byte("GET http://example.com/x?y HTTP/1.1\r\nHost: example.com\r\nProxy-Connection: keep-alive\r\n\r\n"))
	f.Add([]byte("GET http://[::1]:8080/ HTTP/1.1\r\n\r\n"))
	f.Add([]byte("POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
	f.Add([]byte("CONNECT [::1]:443 HTTP/1.0\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	const maxHeader = 1024
	f.Fuzz(func(t *testing.T, data []byte) {
		src := bytes.NewReader(data)
		limit := &headerLimit{r: src, remaining: maxHeader}
		br := bufio.NewReaderSize(limit, 4096)
		req, tg, err := readProxyRequest(br)
		if consumed := len(data) - src.Len(); consumed > maxHeader {
			t.Fatalf("read %d bytes with a %d-byte header limit", consumed, maxHeader)
		}
		if err != nil {
			return
		}
		if req.Method != http.MethodConnect && !(req.URL.IsAbs() && strings.EqualFold(req.URL.Scheme, "http")) {
			t.Fatalf("accepted %s %s", req.Method, req.URL)
		}
		if err := (protocol.EgressRequest{SpawnID: "s", Host: tg.host, Port: tg.port}).Validate(); err != nil {
			t.Fatalf("accepted target %+v: %v", tg, err)
		}
	})
}
