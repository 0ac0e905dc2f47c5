package fdlimit

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const childEnv = "FDLIMIT_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" { // TestRaise's child: raise, print the limits
		_, err := Raise()
		var rl unix.Rlimit
		_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
		fmt.Println(rl.Cur, rl.Max, err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// hasCapSysResource says whether this process may raise a hard limit.
func hasCapSysResource(t *testing.T) bool {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			require.NoError(t, err)
			return caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}

// TestRaise runs Raise in a child started with the kernel's defaults for
// init (1024 soft, 4096 hard), as the nested harness's helper was: with
// CAP_SYS_RESOURCE both limits rise to nr_open, otherwise the soft one to
// the hard one.
func TestRaise(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("needs prlimit (util-linux) to start a child with low limits")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command("prlimit", "--nofile=1024:4096", exe)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	want := "4096 4096 <nil>\n"
	if hasCapSysResource(t) {
		want = fmt.Sprintf("%d %d <nil>\n", nrOpen(), nrOpen())
	}
	assert.Equal(t, want, string(out))
}
