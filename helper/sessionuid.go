package helper

import (
	"errors"
	"sync"

	"github.com/cowork-vmm/cowork-vmm/protocol"
)

// sessionUIDs hands out the uids a guest's sessions run as
// (protocol.SpawnParams.UID), one per session name for the guest's life,
// so that the session's shares (SessionSharer) show its files as owned by
// the uid its processes have. The agent gets the uid with each spawn.
type sessionUIDs struct {
	mu     sync.Mutex
	byName map[string]uint32
}

// errNoSessionUID: every session uid of the guest is taken.
var errNoSessionUID = errors.New("every session uid of this guest is taken: stop and start the VM")

// of returns session's uid, the next free one the first time.
func (s *sessionUIDs) of(session string) (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if uid, ok := s.byName[session]; ok {
		return uid, nil
	}
	if len(s.byName) >= protocol.MaxSessionUIDs {
		return 0, errNoSessionUID
	}
	if s.byName == nil {
		s.byName = make(map[string]uint32)
	}
	uid := uint32(protocol.FirstSessionUID + len(s.byName))
	s.byName[session] = uid
	return uid, nil
}
