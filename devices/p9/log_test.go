package p9

import (
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/stretchr/testify/require"

	"github.com/cowork-vmm/cowork-vmm/internal/ratelog"
	"github.com/cowork-vmm/cowork-vmm/internal/ratelog/ratelogtest"
)

func TestMalformedMessagesAreLoggedRateLimited(t *testing.T) {
	logs := &ratelogtest.LogBuffer{}
	r := newRig(t, Options{Logger: logs.Logger()})
	for i := range 3 * ratelog.DefaultBurst {
		msg := message(msgTclunk, uint16(i), le32(1))
		msg[0] = 0xff // the size field claims more than the chain holds
		u := r.roundTrip(t, msg, 4096)
		assertRlerror(t, u.Data, uint16(i), linux.EINVAL)
	}
	lines := logs.Lines("virtio-9p: 9P message size disagrees with its buffers")
	require.Len(t, lines, ratelog.DefaultBurst, logs.String())
	require.Contains(t, lines[0], "device=virtio-9p tag=cowork")
}
