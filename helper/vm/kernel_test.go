package vm

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
func sources(t *testing.T, override bool, embed []byte, beside []string, cached bool) (kernelSources, string) {
	t.Helper()
	dir := t.TempDir()
	src := kernelSources{executable: filepath.Join(dir, "bin", "cowork-vmm")}
	if err := os.MkdirAll(filepath.Dir(src.executable), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, src.executable)
	if override {
		src.override = filepath.Join(dir, "override-vmlinux")
		writeFile(t, src.override)
	}
	src.embedded = func() (kernelImage, error) {
		if embed == nil {
			return kernelImage{}, embedded.ErrNotEmbedded
		}
		return kernelImage{image: embed, from: "embedded"}, nil
	}
	for _, name := range beside {
		writeFile(t, filepath.Join(dir, "bin", name))
	}
	cache := filepath.Join(dir, "cache", "guest-current", "vmlinux")
	src.cache = func() (string, error) {
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
		k, err := locateKernel(src)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if tc.want == "embedded" {
			if string(k.image) != string(image) || k.path != "" {
				t.Errorf("%s: got path %q, image %q; want the embedded image", tc.name, k.path, k.image)
			}
			continue
		}
		if !strings.HasSuffix(k.path, tc.want) || k.image != nil {
			t.Errorf("%s: got %q, want …%s", tc.name, k.path, tc.want)
		}
	}
}

func TestLocateKernelNoneSaysHowToGetOne(t *testing.T) {
	src, _ := sources(t, false, nil, nil, false)
	_, err := locateKernel(src)
	if err == nil {
		t.Fatal("no kernel anywhere, yet one was found")
	}
	for _, want := range []string{"no guest kernel found", "make kernel", KernelEnv, "not embedded", "cowork-vmm-vmlinux"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestLocateKernelBadOverride(t *testing.T) {
	src, dir := sources(t, false, []byte("embedded"), nil, true)
	src.override = filepath.Join(dir, "missing")
	if _, err := locateKernel(src); err == nil || !strings.Contains(err.Error(), KernelEnv) {
		t.Errorf("missing override: %v", err)
	}
	src.override = dir // a directory
	if _, err := locateKernel(src); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory override: %v", err)
	}
}

func TestLocateKernelDamagedEmbedded(t *testing.T) {
	src, _ := sources(t, false, nil, []string{"vmlinux"}, true)
	src.embedded = func() (kernelImage, error) { return kernelImage{}, errors.New("gzip: invalid header") }
	if _, err := locateKernel(src); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("damaged embedded kernel: %v", err)
	}
}

func TestDefaultKernelSourcesReadEnv(t *testing.T) {
	t.Setenv(KernelEnv, "/some/vmlinux")
	if got := defaultKernelSources("", "/x/cowork-vmm").override; got != "/some/vmlinux" {
		t.Errorf("override from env = %q", got)
	}
	if got := defaultKernelSources("/opt/k", "/x/cowork-vmm").override; got != "/opt/k" {
		t.Errorf("explicit override = %q, want it to beat the env", got)
	}
}
