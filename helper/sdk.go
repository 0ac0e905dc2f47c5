package helper

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// GuestSDKPath is where the installed SDK appears in every guest.
const GuestSDKPath = "/usr/local/bin/claude"

// sdkInstall is the host file installSdk chose.
type sdkInstall struct {
	version string
	file    string // absolute host path of the claude executable
}

func (s *Service) installSdk(_ context.Context, p protocol.InstallSdkParams) (empty, error) {
	if p.Version == "" || strings.ContainsAny(p.Version, "/\x00") || p.Version == "." || p.Version == ".." {
		return nil, fmt.Errorf("installSdk: invalid version %q", p.Version)
	}
	dir, err := hostPathFromClient(p.SdkSubpath)
	if err != nil {
		return nil, fmt.Errorf("installSdk: sdkSubpath: %w", err)
	}
	file := filepath.Join(dir, p.Version, "claude")
	fi, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("installSdk: the SDK binary %s is missing: %w", file, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("installSdk: %s is not a regular file", file)
	}
	sdk := &sdkInstall{version: p.Version, file: file}
	s.mu.Lock()
	s.sdk = sdk
	inst := s.guest
	s.mu.Unlock()
	s.persist() // a restarted helper mounts it at boot without installSdk
	if inst != nil && inst.connected.Load() {
		if err := inst.mountSDK(sdk); err != nil {
			return nil, fmt.Errorf("installSdk: %w", err)
		}
	}
	s.log.Info("SDK installed", "version", p.Version, "path", file)
	return nil, nil
}

// mountSDK mounts the SDK binary read-only at GuestSDKPath, as an
// immutable file: through the guest's cached system share (SystemSharer),
// so that it stays in the guest's page cache across spawns and sessions
// (it is hundreds of MB, and every spawn of claude would otherwise read it
// through the uncached share again). Another version, or this version's
// file replaced on the host since (its identity: device, inode, size,
// mtime), is shared afresh and the old share withdrawn.
func (inst *guestInstance) mountSDK(sdk *sdkInstall) error {
	if err := inst.mounts.mountImmutable(sdk.file, GuestSDKPath); err != nil {
		return fmt.Errorf("mounting the SDK at %s: %w", GuestSDKPath, err)
	}
	return nil
}

// forgetSDK drops sdk, if it is still the installed one.
func (s *Service) forgetSDK(sdk *sdkInstall) {
	s.mu.Lock()
	forgot := s.sdk == sdk
	if forgot {
		s.sdk = nil
	}
	s.mu.Unlock()
	if forgot {
		s.persist()
	}
}
