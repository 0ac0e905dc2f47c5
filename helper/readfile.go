package helper

import (
	"context"
	"fmt"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

func (s *Service) readFile(_ context.Context, p protocol.ClientReadFileParams) (protocol.ClientReadFileResult, error) {
	session := p.ProcessName
	s.mu.Lock()
	if proc := s.procs.get(session); proc != nil && !s.sessionExists(session) {
		session = proc.session // a process id where a session name belongs
	}
	s.mu.Unlock()
	if err := validateSessionName(session); err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	clean, err := confineToSession(session, p.FilePath)
	if err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	inst, err := s.activeVM()
	if err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	defer inst.useSession(session)()
	if err := inst.remountForRead(session, clean); err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	var r protocol.ReadFileResult
	if err := inst.call(protocol.AgentMethodReadFile, protocol.ReadFileParams{Path: clean}, &r); err != nil {
		return protocol.ClientReadFileResult{}, fmt.Errorf("readFile: %w", err)
	}
	return protocol.ClientReadFileResult{Content: r.Content}, nil
}
