package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// The egress channel: one connection per outbound TCP stream a guest process
// asks its proxy for.
//
// The guest has no network device. A spawned process's HTTP proxy (on guest
// loopback) opens one connection to the helper per target — a vsock stream to
// host port guesthost.EgressVSockPort in the VM, a passed socketpair end in the process
// backend — and:
//  1. sends one EgressRequest frame (4-byte BE length + JSON, at most
//     MaxEgressFrameSize bytes) naming the spawn, its token and host:port;
//  2. reads one EgressReply frame: OK (the helper has dialled the target),
//     Blocked (the spawn's allowedDomains refuse the host) or another error;
//  3. after OK, the connection carries the target's raw bytes both ways until
//     either side closes it.
//
// Neither side reads past its frame before step 3: the frames use the bare
// connection, not a buffered reader, so no target byte is swallowed.

// MaxEgressFrameSize caps both egress frames: a host name is at most 253
// bytes, so a request needs far less; anything larger is a hostile peer.
const MaxEgressFrameSize = 4096

// Limits of an EgressRequest's fields.
const (
	MaxEgressHostLen    = 253 // DNS name limit; IPv6 literals are shorter
	MaxEgressSpawnIDLen = 256
	MaxEgressTokenLen   = 128
)

// ErrEgressFrame reports a malformed or oversized egress frame. The
// connection it came from must be closed.
var ErrEgressFrame = errors.New("protocol: bad egress frame")

// EgressRequest asks the helper to open a TCP connection for one spawn.
type EgressRequest struct {
	// SpawnID is the client's spawn id whose allowedDomains apply.
	SpawnID string `json:"spawnId"`
	// Token is the per-spawn secret the helper gave the agent with the spawn
	// (SpawnParams), so that a guest process that can open its own vsock
	// stream cannot borrow another spawn's policy.
	Token string `json:"token,omitempty"`
	// Host is a DNS name or an IP literal (IPv6 without brackets).
	Host string `json:"host"`
	Port int    `json:"port"`
}

// EgressReply answers an EgressRequest.
type EgressReply struct {
	OK bool `json:"ok"`
	// Blocked: the spawn's allowedDomains do not include Host.
	Blocked bool `json:"blocked,omitempty"`
	// Error says why the connection was not made (empty when OK).
	Error string `json:"error,omitempty"`
}

// Validate checks the fields' shape; whether the host is allowed is the
// egress policy's business.
func (r EgressRequest) Validate() error {
	switch {
	case r.SpawnID == "" || len(r.SpawnID) > MaxEgressSpawnIDLen:
		return fmt.Errorf("%w: spawn id must be 1 to %d bytes", ErrEgressFrame, MaxEgressSpawnIDLen)
	case len(r.Token) > MaxEgressTokenLen:
		return fmt.Errorf("%w: token longer than %d bytes", ErrEgressFrame, MaxEgressTokenLen)
	case r.Host == "" || len(r.Host) > MaxEgressHostLen:
		return fmt.Errorf("%w: host must be 1 to %d bytes", ErrEgressFrame, MaxEgressHostLen)
	case strings.ContainsFunc(r.Host, func(c rune) bool { return c <= ' ' || c >= 0x7f || c == '/' || c == '@' }):
		return fmt.Errorf("%w: host %q has characters no host name or IP literal has", ErrEgressFrame, r.Host)
	case r.Port < 1 || r.Port > 65535:
		return fmt.Errorf("%w: port %d is outside 1..65535", ErrEgressFrame, r.Port)
	}
	return nil
}

// WriteEgressRequest validates req and sends it as one frame.
func WriteEgressRequest(w io.Writer, req EgressRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	return writeEgressFrame(w, req)
}

// ReadEgressRequest reads and validates one request frame, reading nothing
// beyond it.
func ReadEgressRequest(r io.Reader) (EgressRequest, error) {
	var req EgressRequest
	if err := readEgressFrame(r, &req); err != nil {
		return EgressRequest{}, err
	}
	if err := req.Validate(); err != nil {
		return EgressRequest{}, err
	}
	return req, nil
}

// WriteEgressReply sends one reply frame; an over-long Error is cut so the
// frame always fits.
func WriteEgressReply(w io.Writer, rep EgressReply) error {
	if len(rep.Error) > MaxEgressFrameSize/2 {
		rep.Error = strings.ToValidUTF8(rep.Error[:MaxEgressFrameSize/2], "") + "…"
	}
	return writeEgressFrame(w, rep)
}

// ReadEgressReply reads one reply frame, reading nothing beyond it.
func ReadEgressReply(r io.Reader) (EgressReply, error) {
	var rep EgressReply
	if err := readEgressFrame(r, &rep); err != nil {
		return EgressReply{}, err
	}
	if rep.OK && (rep.Blocked || rep.Error != "") {
		return EgressReply{}, fmt.Errorf("%w: reply is both OK and refused", ErrEgressFrame)
	}
	return rep, nil
}

func writeEgressFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("protocol: marshal egress frame: %w", err)
	}
	if len(body) > MaxEgressFrameSize {
		return fmt.Errorf("%w: %d bytes exceed %d", ErrEgressFrame, len(body), MaxEgressFrameSize)
	}
	return WriteFrame(w, body)
}

// readEgressFrame reads exactly one frame with the egress cap and decodes it
// strictly: unknown fields and trailing data are errors.
func readEgressFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxEgressFrameSize {
		return fmt.Errorf("%w: peer declared %d bytes, the limit is %d", ErrEgressFrame, n, MaxEgressFrameSize)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrEgressFrame, err)
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return fmt.Errorf("%w: data after the JSON object", ErrEgressFrame)
	}
	return nil
}
