package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Methods of the client ↔ helper contract (PROTOCOL.md "Methods").
const (
	MethodConfigure             = "configure"
	MethodSubscribeEvents       = "subscribeEvents"
	MethodCreateVM              = "createVM"
	MethodStartVM               = "startVM"
	MethodStopVM                = "stopVM"
	MethodIsRunning             = "isRunning"
	MethodIsGuestConnected      = "isGuestConnected"
	MethodSpawn                 = "spawn"
	MethodKill                  = "kill"
	MethodWriteStdin            = "writeStdin"
	MethodIsProcessRunning      = "isProcessRunning"
	MethodSendGuestResponse     = "sendGuestResponse"
	MethodSetDebugLogging       = "setDebugLogging"
	MethodMountPath             = "mountPath"
	MethodReadFile              = "readFile"
	MethodGetSessionsDiskInfo   = "getSessionsDiskInfo"
	MethodDeleteSessionDirs     = "deleteSessionDirs"
	MethodPruneSessionCaches    = "pruneSessionCaches"
	MethodInstallSdk            = "installSdk"
	MethodAddApprovedOauthToken = "addApprovedOauthToken"
	MethodGetNetworkDrives      = "getNetworkDrives"
)

// Methods lists every method of the contract, in PROTOCOL.md order. The
// server answers any other name with "Unknown method: <name>" without
// calling the Handler.
var Methods = [...]string{
	MethodConfigure, MethodSubscribeEvents, MethodCreateVM, MethodStartVM,
	MethodStopVM, MethodIsRunning, MethodIsGuestConnected, MethodSpawn,
	MethodKill, MethodWriteStdin, MethodIsProcessRunning,
	MethodSendGuestResponse, MethodSetDebugLogging, MethodMountPath,
	MethodReadFile, MethodGetSessionsDiskInfo, MethodDeleteSessionDirs,
	MethodPruneSessionCaches, MethodInstallSdk, MethodAddApprovedOauthToken,
	MethodGetNetworkDrives,
}

// IsKnownMethod reports whether name is a method of the contract.
func IsKnownMethod(name string) bool {
	for _, m := range Methods {
		if m == name {
			return true
		}
	}
	return false
}

// ErrUnknownMethod is wrapped by UnknownMethodError. A Handler may return it
// (wrapped) for a method it does not implement; the server then replies with
// exactly "Unknown method: <name>", the wording the client keys on.
var ErrUnknownMethod = errors.New("unknown method")

// UnknownMethodError returns the error for an unknown method. Its message is
// "Unknown method: <name>" — the client disables its cache janitor on exactly
// that wording, so never rephrase it.
func UnknownMethodError(name string) error {
	return &unknownMethodError{name: name}
}

type unknownMethodError struct{ name string }

func (e *unknownMethodError) Error() string { return "Unknown method: " + e.name }
func (e *unknownMethodError) Unwrap() error { return ErrUnknownMethod }

// Request is one client → helper frame: {method, id?, params?}.
//
// ID is nil for a one-shot request and set on the persistent pipe (and may be
// set on subscribeEvents). Any JSON number with an integral value in
// [0, 2^64) is accepted as an id (4, 4.0, 4e0).
type Request struct {
	Method string          `json:"method"`
	ID     *uint64         `json:"id,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
}

// DecodeError is returned by DecodeRequest when a frame is not a valid
// request. RawID holds the frame's "id" exactly as sent when one could be
// read (even when it is not a valid id), so the error reply can carry it.
type DecodeError struct {
	RawID json.RawMessage
	Err   error
}

func (e *DecodeError) Error() string { return "invalid request: " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

// DecodeRequest parses and validates one client frame. Unknown fields are
// ignored; "params": null is treated as absent. On failure the error is a
// *DecodeError.
func DecodeRequest(body []byte) (Request, error) {
	var wire struct {
		Method json.RawMessage `json:"method"`
		ID     json.RawMessage `json:"id"`
		Params json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(body, &wire); err != nil {
		// The frame is not a JSON object; try to salvage an id anyway so
		// that a pipe client is not left waiting for a reply it cannot match.
		return Request{}, &DecodeError{RawID: salvageID(body), Err: fmt.Errorf("frame is not a JSON object: %w", err)}
	}
	var req Request
	rawID := trimNull(wire.ID)
	if rawID != nil {
		id, err := parseID(rawID)
		if err != nil {
			return Request{}, &DecodeError{RawID: rawID, Err: err}
		}
		req.ID = &id
	}
	if wire.Method == nil || bytes.Equal(wire.Method, []byte("null")) {
		return Request{}, &DecodeError{RawID: rawID, Err: errors.New(`missing "method"`)}
	}
	if err := json.Unmarshal(wire.Method, &req.Method); err != nil {
		return Request{}, &DecodeError{RawID: rawID, Err: errors.New(`"method" must be a string`)}
	}
	if req.Method == "" {
		return Request{}, &DecodeError{RawID: rawID, Err: errors.New(`"method" is empty`)}
	}
	if p := trimNull(wire.Params); p != nil {
		req.Params = append(json.RawMessage(nil), p...)
	}
	return req, nil
}

// trimNull returns nil for an absent or JSON null value.
func trimNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil
	}
	return raw
}

// parseID converts a JSON number to a request id.
func parseID(raw json.RawMessage) (uint64, error) {
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf(`"id" must be a number, got %.40s`, raw)
	}
	if v, err := strconv.ParseUint(string(n), 10, 64); err == nil {
		return v, nil
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || f < 0 || f >= math.Exp2(64) || f != math.Trunc(f) {
		return 0, fmt.Errorf(`"id" must be a whole number >= 0, got %s`, n)
	}
	return uint64(f), nil
}

// salvageID extracts a top-level "id" from a frame that failed to decode as
// a whole (e.g. a bad params value), by decoding only the object's keys.
func salvageID(body []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	for dec.More() {
		keyTok, err := dec.Token()
		if err != nil {
			return nil
		}
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil
		}
		if key, ok := keyTok.(string); ok && key == "id" {
			return trimNull(val)
		}
	}
	return nil
}

// Response is one helper → client reply:
// success {success:true, result?, id?}; failure {success:false, error, id?}.
type Response struct {
	Success bool            `json:"success"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   string          `json:"error,omitempty"`
	ID      *uint64         `json:"id,omitempty"`
}

// NewResult builds a success reply; a nil result (or one that marshals to
// null) leaves "result" out.
func NewResult(id *uint64, result any) (Response, error) {
	resp := Response{Success: true, ID: id}
	if result == nil {
		return resp, nil
	}
	raw, err := json.Marshal(result)
	if err != nil {
		return Response{}, fmt.Errorf("protocol: marshal result: %w", err)
	}
	if !bytes.Equal(raw, []byte("null")) {
		resp.Result = raw
	}
	return resp, nil
}

// NewError builds a failure reply. An empty message becomes "internal error"
// so that the client always has something to show.
func NewError(id *uint64, message string) Response {
	if message == "" {
		message = "internal error"
	}
	return Response{Success: false, Error: message, ID: id}
}

// DecodeParams decodes a request's params into a T. Absent or null params
// decode as the zero T (every field is optional on the wire); unknown fields
// are ignored. The error names the method so that it reads well as a reply.
func DecodeParams[T any](method string, params json.RawMessage) (T, error) {
	var v T
	if trimNull(params) == nil {
		return v, nil
	}
	if err := json.Unmarshal(params, &v); err != nil {
		return v, fmt.Errorf("invalid params for %s: %w", method, err)
	}
	return v, nil
}

// Int is an integer that accepts any JSON number with a value in int64
// range: 4, 4.0, 4e3; a fractional value is truncated toward zero (the
// client is JavaScript, which has no integers). null leaves it unchanged.
type Int int64

// UnmarshalJSON implements json.Unmarshaler.
func (n *Int) UnmarshalJSON(b []byte) error {
	if trimNull(b) == nil {
		return nil
	}
	var num json.Number
	if err := json.Unmarshal(b, &num); err != nil {
		return fmt.Errorf("want a number, got %.40s", b)
	}
	if v, err := strconv.ParseInt(string(num), 10, 64); err == nil {
		*n = Int(v)
		return nil
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil || f < math.MinInt64 || f >= math.MaxInt64 {
		return fmt.Errorf("number %s out of range", num)
	}
	*n = Int(math.Trunc(f))
	return nil
}

// ----- params -----

// ConfigureParams: configure. On the pipe the client sends only
// userDataName, userDataRoot and sessionOnly:true.
type ConfigureParams struct {
	UserDataName string `json:"userDataName"`
	UserDataRoot string `json:"userDataRoot"`
	SessionOnly  bool   `json:"sessionOnly,omitempty"`
	// NetworkDrives is kept raw: the Linux client always sends [].
	NetworkDrives            json.RawMessage `json:"networkDrives,omitempty"`
	MemoryMB                 *Int            `json:"memoryMB,omitempty"`
	CPUCount                 *Int            `json:"cpuCount,omitempty"`
	SmolBinPath              string          `json:"smolBinPath,omitempty"`
	LogDir                   string          `json:"logDir,omitempty"`
	VirtiofsdPath            string          `json:"virtiofsdPath,omitempty"`
	FirmwareCodePath         string          `json:"firmwareCodePath,omitempty"`
	FirmwareVarsTemplatePath string          `json:"firmwareVarsTemplatePath,omitempty"`
}

// SubscribeEventsParams: subscribeEvents (identifies the profile).
type SubscribeEventsParams struct {
	UserDataName string `json:"userDataName"`
	UserDataRoot string `json:"userDataRoot"`
}

// CreateVMParams: createVM.
type CreateVMParams struct {
	BundlePath string  `json:"bundlePath"`
	DiskSizeGB float64 `json:"diskSizeGB,omitempty"`
}

// StartVMParams: startVM.
type StartVMParams struct {
	BundlePath  string   `json:"bundlePath"`
	MemoryGB    *float64 `json:"memoryGB,omitempty"`
	CPUCount    *Int     `json:"cpuCount,omitempty"`
	APIProbeURL string   `json:"apiProbeURL,omitempty"`
}

// Modes of an additionalMounts entry. An empty mode means rw; rwd is
// writable like rw (it names deletion explicitly, nothing more).
const (
	MountModeRO  = "ro"
	MountModeRW  = "rw"
	MountModeRWD = "rwd"
)

// AdditionalMount is one spawn.additionalMounts value: Path is a host path
// relative to "/", Mode one of MountModeRO/RW/RWD (empty = rw).
type AdditionalMount struct {
	Path string `json:"path"`
	Mode string `json:"mode,omitempty"`
}

// ReadOnly reports whether the mount refuses writes.
func (m AdditionalMount) ReadOnly() bool { return m.Mode == MountModeRO }

// ValidMode reports whether Mode is one the client may send.
func (m AdditionalMount) ValidMode() bool {
	switch m.Mode {
	case "", MountModeRO, MountModeRW, MountModeRWD:
		return true
	}
	return false
}

// ClientSpawnParams: spawn. (Named Client… because SpawnParams is the
// agent channel's message.)
type ClientSpawnParams struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	Command  string            `json:"command"`
	Args     []string          `json:"args"`
	IsResume bool              `json:"isResume"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// AdditionalMounts maps a mount name (may contain '/') to its source.
	AdditionalMounts  map[string]AdditionalMount `json:"additionalMounts,omitempty"`
	AllowedDomains    []string                   `json:"allowedDomains,omitempty"`
	OneShot           bool                       `json:"oneShot,omitempty"`
	MountSkeletonHome bool                       `json:"mountSkeletonHome,omitempty"`
	OAuthToken        string                     `json:"oauthToken,omitempty"`
}

// ClientKillParams: kill. Signal is a name such as "SIGTERM".
type ClientKillParams struct {
	ID     string `json:"id"`
	Signal string `json:"signal"`
}

// WriteStdinParams: writeStdin. EOF (an extension the desktop client
// never sends) closes the process's stdin after Data: it reads end of input.
type WriteStdinParams struct {
	ID   string `json:"id"`
	Data string `json:"data"`
	EOF  bool   `json:"eof,omitempty"`
}

// IsProcessRunningParams: isProcessRunning.
type IsProcessRunningParams struct {
	ID string `json:"id"`
}

// SendGuestResponseParams: sendGuestResponse. ResultJSON is kept raw (the
// client may send a JSON text as a string, or a value).
type SendGuestResponseParams struct {
	ID         GuestRequestID  `json:"id"`
	ResultJSON json.RawMessage `json:"resultJson,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// GuestRequestID is a request event's id as sendGuestResponse sends it
// back: a JSON string, or a number (an integer: 7, 7.0 and 7e0 are "7"),
// kept as text. The helper's request ids are decimal integers, so either
// form of one names it.
type GuestRequestID string

// UnmarshalJSON implements json.Unmarshaler.
func (id *GuestRequestID) UnmarshalJSON(b []byte) error {
	if trimNull(b) == nil {
		*id = ""
		return nil
	}
	if b = bytes.TrimSpace(b); len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*id = GuestRequestID(s)
		return nil
	}
	var num json.Number
	if err := json.Unmarshal(b, &num); err != nil {
		return fmt.Errorf("want a string or a number as the id, got %.40s", b)
	}
	if v, err := strconv.ParseUint(string(num), 10, 64); err == nil {
		*id = GuestRequestID(strconv.FormatUint(v, 10))
		return nil
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil || f < 0 || f != math.Trunc(f) || f >= 1<<53 {
		return fmt.Errorf("id %s is not a request id (a non-negative integer)", num)
	}
	*id = GuestRequestID(strconv.FormatUint(uint64(f), 10))
	return nil
}

// SetDebugLoggingParams: setDebugLogging.
type SetDebugLoggingParams struct {
	Enabled bool `json:"enabled"`
}

// MountPathParams: mountPath (adds a mount to a running session).
type MountPathParams struct {
	ProcessID string `json:"processId"`
	Subpath   string `json:"subpath"`
	MountName string `json:"mountName"`
	Mode      string `json:"mode"`
}

// ClientReadFileParams: readFile. FilePath is a guest path. (Named Client…
// because ReadFileParams is the agent channel's message.)
type ClientReadFileParams struct {
	ProcessName string `json:"processName"`
	FilePath    string `json:"filePath"`
}

// GetSessionsDiskInfoParams: getSessionsDiskInfo.
type GetSessionsDiskInfoParams struct {
	LowWaterBytes Int `json:"lowWaterBytes"`
}

// DeleteSessionDirsParams: deleteSessionDirs.
type DeleteSessionDirsParams struct {
	Names []string `json:"names"`
}

// PruneSessionCachesParams: pruneSessionCaches. Pointers are nil when the
// client left the field out.
type PruneSessionCachesParams struct {
	OnlyIfFreeBytesBelow       *Int `json:"onlyIfFreeBytesBelow,omitempty"`
	IncludeSessionTmp          bool `json:"includeSessionTmp"`
	SessionTmpOlderThanSeconds *Int `json:"sessionTmpOlderThanSeconds,omitempty"`
}

// InstallSdkParams: installSdk. The host file /<SdkSubpath>/<Version>/claude
// becomes /usr/local/bin/claude in the guest.
type InstallSdkParams struct {
	SdkSubpath string `json:"sdkSubpath"`
	Version    string `json:"version"`
}

// AddApprovedOauthTokenParams: addApprovedOauthToken.
type AddApprovedOauthTokenParams struct {
	Token string `json:"token"`
}

// ----- results -----

// IsRunningResult: isRunning.
type IsRunningResult struct {
	Running bool `json:"running"`
}

// IsGuestConnectedResult: isGuestConnected.
type IsGuestConnectedResult struct {
	Connected bool `json:"connected"`
}

// SpawnResult: spawn. FailedMounts names the additionalMounts entries that
// could not be made (the spawn still proceeds); always an array.
type SpawnResult struct {
	FailedMounts []string `json:"failedMounts"`
}

// MarshalJSON emits "failedMounts":[] rather than null.
func (r SpawnResult) MarshalJSON() ([]byte, error) {
	f := r.FailedMounts
	if f == nil {
		f = []string{}
	}
	return json.Marshal(struct {
		FailedMounts []string `json:"failedMounts"`
	}{f})
}

// IsProcessRunningResult: isProcessRunning. An unknown id is {running:false}.
type IsProcessRunningResult struct {
	Running  bool `json:"running"`
	ExitCode *int `json:"exitCode,omitempty"`
}

// ClientReadFileResult: readFile. Content is sent as standard base64 of the
// raw bytes ("" for an empty file, never null).
type ClientReadFileResult struct {
	Content []byte `json:"content"`
}

// MarshalJSON keeps content a string even when empty.
func (r ClientReadFileResult) MarshalJSON() ([]byte, error) {
	c := r.Content
	if c == nil {
		c = []byte{}
	}
	return json.Marshal(struct {
		Content []byte `json:"content"`
	}{c})
}

// SessionDisk is one session in getSessionsDiskInfo.
type SessionDisk struct {
	Name      string `json:"name"`
	SizeBytes int64  `json:"sizeBytes"`
}

// DiskInfoResult: getSessionsDiskInfo. Sessions is always an array.
type DiskInfoResult struct {
	TotalBytes int64         `json:"totalBytes"`
	FreeBytes  int64         `json:"freeBytes"`
	Sessions   []SessionDisk `json:"sessions"`
}

// MarshalJSON emits "sessions":[] rather than null.
func (r DiskInfoResult) MarshalJSON() ([]byte, error) {
	type plain DiskInfoResult
	p := plain(r)
	if p.Sessions == nil {
		p.Sessions = []SessionDisk{}
	}
	return json.Marshal(p)
}

// DeleteResult: deleteSessionDirs. Errors maps a name to why it was not
// deleted. Both fields are always present: deleted:[] and errors:{}.
type DeleteResult struct {
	Deleted []string          `json:"deleted"`
	Errors  map[string]string `json:"errors"`
}

// MarshalJSON emits empty collections rather than null.
func (r DeleteResult) MarshalJSON() ([]byte, error) {
	type plain DeleteResult
	p := plain(r)
	if p.Deleted == nil {
		p.Deleted = []string{}
	}
	if p.Errors == nil {
		p.Errors = map[string]string{}
	}
	return json.Marshal(p)
}

// PruneResult: pruneSessionCaches. Collections are always present.
type PruneResult struct {
	PrunedSessions  []string          `json:"prunedSessions"`
	SkippedSessions []string          `json:"skippedSessions"`
	FreedBytes      int64             `json:"freedBytes"`
	Errors          map[string]string `json:"errors"`
}

// MarshalJSON emits empty collections rather than null.
func (r PruneResult) MarshalJSON() ([]byte, error) {
	type plain PruneResult
	p := plain(r)
	if p.PrunedSessions == nil {
		p.PrunedSessions = []string{}
	}
	if p.SkippedSessions == nil {
		p.SkippedSessions = []string{}
	}
	if p.Errors == nil {
		p.Errors = map[string]string{}
	}
	return json.Marshal(p)
}

// NetworkDrivesResult: getNetworkDrives. Drives is always an array ([] on
// Linux).
type NetworkDrivesResult struct {
	Drives []json.RawMessage `json:"drives"`
}

// MarshalJSON emits "drives":[] rather than null.
func (r NetworkDrivesResult) MarshalJSON() ([]byte, error) {
	d := r.Drives
	if d == nil {
		d = []json.RawMessage{}
	}
	return json.Marshal(struct {
		Drives []json.RawMessage `json:"drives"`
	}{d})
}
