package helper

import "github.com/cowork-vmm/cowork-vmm/protocol"

// Params are the typed messages of package protocol (which accept any JSON
// number where the client, being JavaScript, may send 4.0); results are
// declared here with exactly the shapes PROTOCOL.md gives.
type (
	configureParams             = protocol.ConfigureParams
	startVMParams               = protocol.StartVMParams
	spawnParams                 = protocol.ClientSpawnParams
	killParams                  = protocol.ClientKillParams
	writeStdinParams            = protocol.WriteStdinParams
	idParams                    = protocol.IsProcessRunningParams
	sendGuestResponseParams     = protocol.SendGuestResponseParams
	setDebugLoggingParams       = protocol.SetDebugLoggingParams
	mountPathParams             = protocol.MountPathParams
	readFileParams              = protocol.ClientReadFileParams
	diskInfoParams              = protocol.GetSessionsDiskInfoParams
	deleteSessionDirsParams     = protocol.DeleteSessionDirsParams
	pruneParams                 = protocol.PruneSessionCachesParams
	installSdkParams            = protocol.InstallSdkParams
	addApprovedOauthTokenParams = protocol.AddApprovedOauthTokenParams
)

type runningResult struct {
	Running bool `json:"running"`
}

type connectedResult struct {
	Connected bool `json:"connected"`
}

type spawnResult struct {
	FailedMounts []string `json:"failedMounts"`
}

type processRunningResult struct {
	Running  bool `json:"running"`
	ExitCode *int `json:"exitCode,omitempty"`
}

type readFileResult struct {
	Content string `json:"content"` // base64
}

type sessionDiskInfo struct {
	Name      string `json:"name"`
	SizeBytes int64  `json:"sizeBytes"`
}

type diskInfoResult struct {
	TotalBytes int64             `json:"totalBytes"`
	FreeBytes  int64             `json:"freeBytes"`
	Sessions   []sessionDiskInfo `json:"sessions"`
}

type deleteSessionDirsResult struct {
	Deleted []string          `json:"deleted"`
	Errors  map[string]string `json:"errors"`
}

type pruneResult struct {
	PrunedSessions  []string          `json:"prunedSessions"`
	SkippedSessions []string          `json:"skippedSessions"`
	FreedBytes      int64             `json:"freedBytes"`
	Errors          map[string]string `json:"errors"`
}

type networkDrivesResult struct {
	Drives []any `json:"drives"`
}
