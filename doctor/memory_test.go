package doctor

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

type statsGuest map[string]uint64

func (s statsGuest) MemoryStats() map[string]uint64 { return s }

// TestGuestMemory: the trial boot shows the balloon's statistics, says
// when there are none, and nothing for a guest without a balloon.
func TestGuestMemory(t *testing.T) {
	assert.Equal(t, "balloon: guest RAM 488 MiB, free 400 MiB, available 420 MiB, caches 12 MiB",
		guestMemory(statsGuest{"total_memory": 488 << 20, "free_memory": 400 << 20, "available_memory": 420 << 20, "caches": 12 << 20}))
	assert.Equal(t, "no balloon statistics", guestMemory(statsGuest{}))
	assert.Empty(t, guestMemory(struct{}{}))
}
