package kernel

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/guest/kernel/embedded"
)

func writeFile(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, []byte("\x7fELF"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sources returns kernel sources where each place is set up as asked.
func sources(t *testing.T, override bool, embed []byte, beside []string, cached bool) (Sources, string) {
	t.Helper()
	dir := t.TempDir()
	src := Sources{Executable: filepath.Join(dir, "bin", "cowork-vmm")}
	if err := os.MkdirAll(filepath.Dir(src.Executable), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, src.Executable)
	if override {
		src.Override = filepath.Join(dir, "override-vmlinux")
		writeFile(t, src.Override)
	}
	src.Embedded = func() (Image, error) {
		if embed == nil {
			return Image{}, embedded.ErrNotEmbedded
		}
		return Image{Bytes: embed, From: "embedded"}, nil
	}
	for _, name := range beside {
		writeFile(t, filepath.Join(dir, "bin", name))
	}
	cache := filepath.Join(dir, "cache", "guest-current", "vmlinux")
	src.Cache = func() (string, error) {
		if !cached {
			return "", errors.New("no guest kernel built: run `make kernel`")
		}
		return cache, nil
	}
	return src, dir
}

func TestLocateKernelOrder(t *testing.T) {
	image := []byte("embedded kernel")
	for _, tc := range []struct {
		name     string
		override bool
		embed    []byte
		beside   []string
		cached   bool
		want     string // path suffix, or "embedded"
	}{
		{"override wins", true, image, []string{"vmlinux"}, true, "override-vmlinux"},
		{"embedded before files", false, image, []string{"vmlinux"}, true, "embedded"},
		{"vmlinux beside the executable", false, nil, []string{"vmlinux", "cowork-vmm-vmlinux"}, true, "bin/vmlinux"},
		{"cowork-vmm-vmlinux beside the executable", false, nil, []string{"cowork-vmm-vmlinux"}, true, "bin/cowork-vmm-vmlinux"},
		{"build cache last", false, nil, nil, true, "cache/guest-current/vmlinux"},
	} {
		src, _ := sources(t, tc.override, tc.embed, tc.beside, tc.cached)
		k, err := Locate(src)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if tc.want == "embedded" {
			if string(k.Bytes) != string(image) || k.Path != "" {
				t.Errorf("%s: got path %q, image %q; want the embedded image", tc.name, k.Path, k.Bytes)
			}
			continue
		}
		if !strings.HasSuffix(k.Path, tc.want) || k.Bytes != nil {
			t.Errorf("%s: got %q, want …%s", tc.name, k.Path, tc.want)
		}
	}
}

func TestLocateKernelNoneSaysHowToGetOne(t *testing.T) {
	src, _ := sources(t, false, nil, nil, false)
	_, err := Locate(src)
	if err == nil {
		t.Fatal("no kernel anywhere, yet one was found")
	}
	for _, want := range []string{"no guest kernel found", "make kernel", Env, "not embedded", "cowork-vmm-vmlinux"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestLocateKernelBadOverride(t *testing.T) {
	src, dir := sources(t, false, []byte("embedded"), nil, true)
	src.Override = filepath.Join(dir, "missing")
	if _, err := Locate(src); err == nil || !strings.Contains(err.Error(), Env) {
		t.Errorf("missing override: %v", err)
	}
	src.Override = dir // a directory
	if _, err := Locate(src); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory override: %v", err)
	}
}

func TestLocateKernelDamagedEmbedded(t *testing.T) {
	src, _ := sources(t, false, nil, []string{"vmlinux"}, true)
	src.Embedded = func() (Image, error) { return Image{}, errors.New("gzip: invalid header") }
	if _, err := Locate(src); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("damaged embedded kernel: %v", err)
	}
}

func TestDefaultKernelSourcesReadEnv(t *testing.T) {
	t.Setenv(Env, "/some/vmlinux")
	if got := DefaultSources("", "/x/cowork-vmm", nil).Override; got != "/some/vmlinux" {
		t.Errorf("override from env = %q", got)
	}
	if got := DefaultSources("/opt/k", "/x/cowork-vmm", nil).Override; got != "/opt/k" {
		t.Errorf("explicit override = %q, want it to beat the env", got)
	}
}
