package job

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHiddenInGuest(t *testing.T) {
	for p, hidden := range map[string]bool{
		"/tmp/clone/cowork-vmm": true, "/tmp": true, "/root/src": true, "/run/x": true, "/var/tmp/x": true,
		"/work/main": false, "/home/u/src": false, "/var/lib/x": false, "/tmpfoo/x": false, "/var/tmpx": false,
		"/payload": true, "/proc/1": true,
	} {
		require.Equal(t, hidden, HiddenInGuest(p), p)
	}
	for _, name := range FreshDirNames() {
		_, fresh := FreshDir(name)
		require.True(t, fresh, name)
	}
}

func TestValidateShares(t *testing.T) {
	j := Job{Token: "t", Cmd: []string{"true"}, Dir: "/", Timeout: time.Second, Shares: []string{"/tmp/clone"}}
	require.NoError(t, j.Validate())
	for _, bad := range [][]string{{"relative"}, {"/"}, {"/a,b"}, {"/a/../b"}, {""}, {"/a", "/b", "/c", "/d", "/e"}} {
		j.Shares = bad
		require.Error(t, j.Validate(), "%q", bad)
	}
}
