package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/egress"
	"github.com/cowork-vmm/cowork-vmm/egress/fdpass"
	"github.com/cowork-vmm/cowork-vmm/guest/proxy"
)

// The process backend end to end, with the test binary in three roles:
// the test (host side: egress server on an fdpass listener), the "agent"
// (re-executed in a new user and network namespace, as the process
// backend's sandbox; it makes a per-spawn namespace, the proxy in it, and
// spawns the "process"), and the "process" (which tries the proxy and a
// direct connection).
const (
	roleEnv    = "PROXY_TEST_ROLE"
	tokenEnv   = "PROXY_TEST_TOKEN"
	targetsEnv = "PROXY_TEST_TARGETS" // allowed URL, blocked URL, direct address
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "agent":
		os.Exit(runAgent())
	case "process":
		os.Exit(runProcess())
	}
	os.Exit(m.Run())
}

// runAgent is what guest/agent does per spawn in the process backend.
func runAgent() int {
	f := os.NewFile(3, "egress-control")
	c, err := net.FileConn(f)
	if err != nil {
		fmt.Println("agent: control socket:", err)
		return 1
	}
	// Read before any thread entered a new namespace (the namespace's
	// thread may be the main one, which /proc/self shows).
	agentNS, _ := os.Readlink("/proc/thread-self/ns/net")
	p, err := proxy.NewNamespaced(proxy.Config{SpawnID: "spawn-1", Token: os.Getenv(tokenEnv), Dial: &fdpass.Dialer{Conn: c.(*net.UnixConn)}})
	if err != nil {
		fmt.Println("agent:", err)
		return 1
	}
	defer p.Close()
	exe, _ := os.Executable()
	cmd := exec.Command(exe)
	cmd.Env = proxy.MergeEnv(append(os.Environ(), roleEnv+"=process", "PROXY_TEST_AGENT_NETNS="+agentNS), p.URL())
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stdout
	// As the agent's sandboxed spawns: a nested user namespace.
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
	if err := p.Start(cmd.Start); err != nil {
		fmt.Println("agent: spawn:", err)
		return 1
	}
	if err := cmd.Wait(); err != nil {
		fmt.Println("agent: process:", err)
		return 1
	}
	return 0
}

// runProcess prints one line per attempt.
func runProcess() int {
	targets := strings.Fields(os.Getenv(targetsEnv))
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment}}
	for _, u := range targets[:2] {
		resp, err := client.Get(u)
		if err != nil {
			fmt.Println("error", err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s\n", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if own, _ := os.Readlink("/proc/self/ns/net"); own != "" && own != os.Getenv("PROXY_TEST_AGENT_NETNS") {
		fmt.Println("own netns")
	} else {
		fmt.Println("shares the agent's netns")
	}
	if c, err := net.Dial("tcp", targets[2]); err != nil {
		fmt.Println("direct refused")
	} else {
		c.Close()
		fmt.Println("direct connected")
	}
	return 0
}

func TestProcessBackendSandbox(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.Host)
	}))
	defer upstream.Close()
	port := upstream.Listener.Addr().(*net.TCPAddr).Port

	reg := egress.NewRegistry()
	token, _ := reg.Register("spawn-1", []string{"*.example.test"})
	srv := newServer(t, reg)

	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	agentEnd := os.NewFile(uintptr(fds[0]), "agent-end")
	helperFile := os.NewFile(uintptr(fds[1]), "helper-end")
	hc, err := net.FileConn(helperFile)
	helperFile.Close()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx, fdpass.NewListener(hc.(*net.UnixConn)))

	exe, err := os.Executable()
	require.NoError(t, err)
	var out strings.Builder
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"=agent", tokenEnv+"="+token, targetsEnv+"="+strings.Join([]string{
		fmt.Sprintf("http://api.example.test:%d/", port),
		fmt.Sprintf("http://evil-example.test:%d/", port),
		upstream.Listener.Addr().String(),
	}, " "))
	cmd.ExtraFiles = []*os.File{agentEnd}
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
		Pdeathsig:                  unix.SIGKILL,
	}
	err = cmd.Start()
	agentEnd.Close()
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC) {
		t.Skipf("user and network namespaces are not available here: %v", err)
	}
	require.NoError(t, err)
	require.NoError(t, cmd.Wait(), out.String())

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Equal(t, []string{
		fmt.Sprintf("200 hello api.example.test:%d", port),
		"403 blocked-by-allowlist: evil-example.test",
		"own netns",
		"direct refused",
	}, lines)
}
