package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeRequestModes(t *testing.T) {
	req, err := DecodeRequest([]byte(`{"method":"isRunning"}`))
	require.NoError(t, err)
	assert.Equal(t, "isRunning", req.Method)
	assert.Nil(t, req.ID, "no id: one-shot")
	assert.Nil(t, req.Params)

	req, err = DecodeRequest([]byte(`{"method":"configure","id":1,"params":{"userDataName":"p","sessionOnly":true}}`))
	require.NoError(t, err)
	require.NotNil(t, req.ID)
	assert.Equal(t, uint64(1), *req.ID)
	assert.JSONEq(t, `{"userDataName":"p","sessionOnly":true}`, string(req.Params))
}

func TestDecodeRequestLenientID(t *testing.T) {
	for in, want := range map[string]uint64{
		`4`: 4, `4.0`: 4, `4e0`: 4, `0`: 0, `1e3`: 1000, `18446744073709551615`: 1<<64 - 1,
	} {
		req, err := DecodeRequest([]byte(`{"method":"isRunning","id":` + in + `}`))
		require.NoError(t, err, in)
		require.NotNil(t, req.ID, in)
		assert.Equal(t, want, *req.ID, in)
	}
	req, err := DecodeRequest([]byte(`{"method":"isRunning","id":null}`))
	require.NoError(t, err)
	assert.Nil(t, req.ID, "id null is the same as no id")
}

func TestDecodeRequestInvalid(t *testing.T) {
	cases := []struct {
		body  string
		rawID string // "" = no id readable
	}{
		{`{bad`, ""},
		{`[]`, ""},
		{`"isRunning"`, ""},
		{`{}`, ""},
		{`{"method":""}`, ""},
		{`{"method":5,"id":7}`, "7"},
		{`{"method":null,"id":8}`, "8"},
		{`{"id":9}`, "9"},
		{`{"method":"isRunning","id":1.5}`, "1.5"},
		{`{"method":"isRunning","id":-1}`, "-1"},
		{`{"method":"isRunning","id":"abc"}`, `"abc"`},
		// Broken after the id: the id is still salvaged.
		{`{"id":12,"method":"isRunning","params":{`, "12"},
		{`{"id":13,"method":"isRunning","params":{"a":}}`, "13"},
	}
	for _, tc := range cases {
		_, err := DecodeRequest([]byte(tc.body))
		require.Error(t, err, tc.body)
		var de *DecodeError
		require.True(t, errors.As(err, &de), "%s: want *DecodeError, got %T", tc.body, err)
		if tc.rawID == "" {
			assert.Nil(t, de.RawID, tc.body)
		} else {
			assert.Equal(t, tc.rawID, string(de.RawID), tc.body)
		}
		assert.Contains(t, err.Error(), "invalid request", tc.body)
	}
}

func TestDecodeRequestIgnoresUnknownFieldsAndNullParams(t *testing.T) {
	req, err := DecodeRequest([]byte(`{"method":"stopVM","id":2,"params":null,"extra":{"x":1}}`))
	require.NoError(t, err)
	assert.Nil(t, req.Params)
}

func TestUnknownMethodWording(t *testing.T) {
	err := UnknownMethodError("getMemoryTier")
	assert.Equal(t, "Unknown method: getMemoryTier", err.Error())
	assert.ErrorIs(t, err, ErrUnknownMethod)
	assert.ErrorIs(t, fmt.Errorf("wrapped: %w", err), ErrUnknownMethod)
}

func TestMethodsTable(t *testing.T) {
	assert.Len(t, Methods, 21, "PROTOCOL.md lists 21 methods")
	for _, m := range Methods {
		assert.True(t, IsKnownMethod(m), m)
	}
	assert.False(t, IsKnownMethod("getMemoryTier"))
	assert.False(t, IsKnownMethod(""))
}

func TestResponseShapes(t *testing.T) {
	id := uint64(3)
	ok, err := NewResult(nil, nil)
	require.NoError(t, err)
	assertJSON(t, `{"success":true}`, ok)

	ok, err = NewResult(&id, IsRunningResult{Running: true})
	require.NoError(t, err)
	assertJSON(t, `{"success":true,"result":{"running":true},"id":3}`, ok)

	fail := NewError(&id, "boom")
	assertJSON(t, `{"success":false,"error":"boom","id":3}`, fail)
	assertJSON(t, `{"success":false,"error":"internal error"}`, NewError(nil, ""))

	_, err = NewResult(nil, func() {})
	assert.Error(t, err)
}

func assertJSON(t *testing.T, want string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	assert.JSONEq(t, want, string(b))
}

func TestResultShapesNeverNull(t *testing.T) {
	assertJSON(t, `{"deleted":[],"errors":{}}`, DeleteResult{})
	assertJSON(t, `{"deleted":["a"],"errors":{"b":"busy"}}`,
		DeleteResult{Deleted: []string{"a"}, Errors: map[string]string{"b": "busy"}})
	assertJSON(t, `{"prunedSessions":[],"skippedSessions":[],"freedBytes":0,"errors":{}}`, PruneResult{})
	assertJSON(t, `{"totalBytes":10,"freeBytes":5,"sessions":[]}`, DiskInfoResult{TotalBytes: 10, FreeBytes: 5})
	assertJSON(t, `{"totalBytes":0,"freeBytes":0,"sessions":[{"name":"s","sizeBytes":4}]}`,
		DiskInfoResult{Sessions: []SessionDisk{{Name: "s", SizeBytes: 4}}})
	assertJSON(t, `{"drives":[]}`, NetworkDrivesResult{})
	assertJSON(t, `{"content":""}`, ClientReadFileResult{})
	assertJSON(t, `{"content":"aGk="}`, ClientReadFileResult{Content: []byte("hi")})
	assertJSON(t, `{"running":false}`, IsProcessRunningResult{})
	code := 0
	assertJSON(t, `{"running":false,"exitCode":0}`, IsProcessRunningResult{ExitCode: &code})
	assertJSON(t, `{"failedMounts":[]}`, SpawnResult{})
	assertJSON(t, `{"failedMounts":["m"]}`, SpawnResult{FailedMounts: []string{"m"}})
	assertJSON(t, `{"connected":true}`, IsGuestConnectedResult{Connected: true})

	// Pointer receivers of the shapes marshal the same way (they are often
	// returned as pointers from handlers).
	assertJSON(t, `{"deleted":[],"errors":{}}`, &DeleteResult{})
}

func TestDecodeParamsAsTheClientSendsThem(t *testing.T) {
	spawn, err := DecodeParams[ClientSpawnParams](MethodSpawn, json.RawMessage(`{
		"id":"p1","name":"sess","command":"/usr/local/bin/claude","args":["-p","hi"],
		"isResume":false,"cwd":"/sessions/sess","env":{"A":"1"},
		"additionalMounts":{".claude/skills":{"path":"home/u/skills","mode":"ro"},"w":{"path":"tmp/w","mode":""}},
		"allowedDomains":["api.anthropic.com","*.example.com"],"oneShot":true,"mountSkeletonHome":true,
		"oauthToken":"tok","somethingNew":42}`))
	require.NoError(t, err)
	assert.Equal(t, "p1", spawn.ID)
	assert.Equal(t, []string{"-p", "hi"}, spawn.Args)
	assert.Equal(t, map[string]string{"A": "1"}, spawn.Env)
	require.Contains(t, spawn.AdditionalMounts, ".claude/skills")
	assert.True(t, spawn.AdditionalMounts[".claude/skills"].ReadOnly())
	assert.False(t, spawn.AdditionalMounts["w"].ReadOnly(), "empty mode is rw")
	assert.True(t, spawn.AdditionalMounts["w"].ValidMode())
	assert.False(t, AdditionalMount{Mode: "rx"}.ValidMode())
	assert.Equal(t, "tok", spawn.OAuthToken)
	assert.True(t, spawn.OneShot)

	cfg, err := DecodeParams[ConfigureParams](MethodConfigure, json.RawMessage(
		`{"userDataName":"n","userDataRoot":"/r","networkDrives":[],"memoryMB":4096.0,"cpuCount":2,"smolBinPath":"/s"}`))
	require.NoError(t, err)
	require.NotNil(t, cfg.MemoryMB)
	assert.Equal(t, Int(4096), *cfg.MemoryMB)
	assert.Equal(t, Int(2), *cfg.CPUCount)

	start, err := DecodeParams[StartVMParams](MethodStartVM, json.RawMessage(`{"bundlePath":"/b","memoryGB":4,"cpuCount":4.0}`))
	require.NoError(t, err)
	require.NotNil(t, start.MemoryGB)
	assert.InDelta(t, 4.0, *start.MemoryGB, 0)
	assert.Equal(t, Int(4), *start.CPUCount)
	assert.Empty(t, start.APIProbeURL)

	prune, err := DecodeParams[PruneSessionCachesParams](MethodPruneSessionCaches, json.RawMessage(
		`{"onlyIfFreeBytesBelow":1e9,"includeSessionTmp":true,"sessionTmpOlderThanSeconds":86400.5}`))
	require.NoError(t, err)
	assert.Equal(t, Int(1_000_000_000), *prune.OnlyIfFreeBytesBelow)
	assert.Equal(t, Int(86400), *prune.SessionTmpOlderThanSeconds, "fractions truncate")

	none, err := DecodeParams[PruneSessionCachesParams](MethodPruneSessionCaches, nil)
	require.NoError(t, err)
	assert.Nil(t, none.OnlyIfFreeBytesBelow, "missing params decode as zero")

	_, err = DecodeParams[ClientKillParams](MethodKill, json.RawMessage(`{"id":3}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid params for kill")

	_, err = DecodeParams[GetSessionsDiskInfoParams](MethodGetSessionsDiskInfo, json.RawMessage(`{"lowWaterBytes":"x"}`))
	assert.Error(t, err)
	_, err = DecodeParams[GetSessionsDiskInfoParams](MethodGetSessionsDiskInfo, json.RawMessage(`{"lowWaterBytes":1e300}`))
	assert.Error(t, err, "out of int64 range")
	di, err := DecodeParams[GetSessionsDiskInfoParams](MethodGetSessionsDiskInfo, json.RawMessage(`{"lowWaterBytes":null}`))
	require.NoError(t, err)
	assert.Zero(t, di.LowWaterBytes)

	sgr, err := DecodeParams[SendGuestResponseParams](MethodSendGuestResponse, json.RawMessage(`{"id":"g1","resultJson":"{\"a\":1}"}`))
	require.NoError(t, err)
	assert.Equal(t, `"{\"a\":1}"`, string(sgr.ResultJSON))
}
