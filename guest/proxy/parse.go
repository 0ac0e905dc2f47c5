package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// target is where a proxy request goes.
type target struct {
	host string // name or IP literal, IPv6 without brackets
	port int
}

// readProxyRequest reads one request head from a client and says where it
// goes. Accepted: "CONNECT host:port" (the port is required) and requests
// in absolute form with the http scheme ("GET http://host[:port]/path").
// Everything else (origin form, https:// absolute URIs, user info, bad
// ports) is an error the client sees as 400.
func readProxyRequest(br *bufio.Reader) (*http.Request, target, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		if errors.Is(err, errHeaderTooLarge) {
			return nil, target{}, errHeaderTooLarge
		}
		return nil, target{}, err
	}
	t, err := requestTarget(req)
	if err != nil {
		return nil, target{}, err
	}
	return req, t, nil
}

func requestTarget(req *http.Request) (target, error) {
	if req.Method == http.MethodConnect {
		host, port, err := splitTarget(req.RequestURI, "")
		if err != nil {
			return target{}, fmt.Errorf("CONNECT needs host:port: %w", err)
		}
		return target{host: host, port: port}, nil
	}
	u := req.URL
	if u == nil || !u.IsAbs() || u.Host == "" {
		return target{}, errors.New("this is an HTTP proxy: send an absolute URI (http://host/path) or CONNECT host:port")
	}
	if !strings.EqualFold(u.Scheme, "http") {
		return target{}, fmt.Errorf("the proxy forwards plain http:// URIs only; use CONNECT for %s", u.Scheme)
	}
	if u.User != nil {
		return target{}, errors.New("user info in the URI is not forwarded")
	}
	host, port, err := splitTarget(u.Host, "80")
	if err != nil {
		return target{}, err
	}
	return target{host: host, port: port}, nil
}

// splitTarget splits "host:port" ("[v6]:port"); defaultPort applies when
// there is no port ("" = required).
func splitTarget(hostport, defaultPort string) (string, int, error) {
	host, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		if defaultPort == "" || strings.Count(hostport, ":") > 0 && !strings.HasPrefix(hostport, "[") {
			return "", 0, fmt.Errorf("bad host:port %q", hostport)
		}
		host, portText = strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), defaultPort
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", hostport)
	}
	req := protocol.EgressRequest{SpawnID: "x", Host: host, Port: port}
	if err := req.Validate(); err != nil {
		return "", 0, fmt.Errorf("bad host %q", host)
	}
	return host, port, nil
}
