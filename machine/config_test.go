package machine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cowork-vmm/cowork-vmm/vmm/loader"
)

func TestConfigDefaultsAndLimits(t *testing.T) {
	c, err := Config{}.withDefaults()
	if err != nil || c.MemMiB != DefaultMemMiB || c.CPUs != DefaultCPUs || c.Console == nil || c.Logger == nil {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	for _, bad := range []Config{{MemMiB: 1}, {MemMiB: -5}, {CPUs: -1}, {CPUs: 1000}, {MemMiB: 1 << 30}} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestCmdlineComposition(t *testing.T) {
	c := Config{Cmdline: " loglevel=7 "}
	got := c.baseCmdline()
	if !strings.HasPrefix(got, DefaultCmdline) || !strings.HasSuffix(got, " loglevel=7") {
		t.Errorf("appended cmdline %q", got)
	}
	for _, want := range defaultCmdlineWords {
		if !strings.Contains(got, want) {
			t.Errorf("default cmdline lacks %s: %q", want, got)
		}
	}
	c = Config{Cmdline: "console=ttyS0 reboot=t", NoDefaultCmdline: true}
	if got := c.baseCmdline(); got != "console=ttyS0 reboot=t" {
		t.Errorf("replaced cmdline %q", got)
	}
}

func TestImagesMapFilesOrTakeBytes(t *testing.T) {
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinux"), filepath.Join(dir, "initrd")
	if err := os.WriteFile(kernel, []byte("K"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, []byte("initrd"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := Config{Kernel: kernel, Initrd: initrd}.images()
	if err != nil || string(b.kernel) != "K" || b.unmap == nil || b.initrd == nil || b.initrd.Size() != 6 {
		t.Fatalf("from files: %+v %v", b, err)
	}
	mem := &recordingMemory{}
	if err := b.initrd.WriteTo(mem, 0x1000); err != nil || string(mem.data) != "initrd" || mem.at != 0x1000 {
		t.Errorf("initrd streamed %q at %#x: %v", mem.data, mem.at, err)
	}
	b.release()
	b.release() // idempotent
	if b.kernel != nil || b.unmap != nil {
		t.Error("release kept the mapping")
	}

	// An initrd that grew after it was placed must not spill past its room.
	b, err = Config{KernelImage: []byte("k"), Initrd: initrd}.images()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, []byte("initrd grew"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.initrd.WriteTo(&recordingMemory{}, 0); !errors.Is(err, loader.ErrStreamFull) {
		t.Errorf("grown initrd: %v", err)
	}

	b, err = Config{KernelImage: []byte("k")}.images()
	if err != nil || string(b.kernel) != "k" || b.initrd != nil || b.unmap != nil {
		t.Errorf("from bytes: %+v %v", b, err)
	}
	if _, err := (Config{}).images(); err == nil || !strings.Contains(err.Error(), "Config.Kernel") {
		t.Errorf("no kernel: %v", err)
	}
	if _, err := (Config{Kernel: filepath.Join(dir, "missing")}).images(); err == nil {
		t.Error("missing kernel accepted")
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (Config{Kernel: empty}).images(); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty kernel: %v", err)
	}
	if _, err := (Config{Kernel: dir}).images(); err == nil {
		t.Error("a directory accepted as the kernel")
	}
	if _, err := (Config{Kernel: kernel, Initrd: filepath.Join(dir, "missing")}).images(); err == nil {
		t.Error("missing initrd accepted")
	}
}

// recordingMemory is guest memory that keeps what was written in order.
type recordingMemory struct {
	at   uint64
	data []byte
}

func (r *recordingMemory) WriteAt(p []byte, gpa uint64) error {
	if len(r.data) == 0 {
		r.at = gpa
	}
	r.data = append(r.data, p...)
	return nil
}
