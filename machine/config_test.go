package machine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	for _, want := range []string{"console=ttyS0", "reboot=k", "panic=-1", "i8042.noaux", "i8042.nokbd", "initcall_blacklist=cmos_init"} {
		if !strings.Contains(got, want) {
			t.Errorf("default cmdline lacks %s: %q", want, got)
		}
	}
	c = Config{Cmdline: "console=ttyS0 reboot=t", NoDefaultCmdline: true}
	if got := c.baseCmdline(); got != "console=ttyS0 reboot=t" {
		t.Errorf("replaced cmdline %q", got)
	}
}

func TestImagesReadFilesOrBytes(t *testing.T) {
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinux"), filepath.Join(dir, "initrd")
	if err := os.WriteFile(kernel, []byte("K"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, []byte("I"), 0o644); err != nil {
		t.Fatal(err)
	}
	k, i, err := Config{Kernel: kernel, Initrd: initrd}.images()
	if err != nil || string(k) != "K" || string(i) != "I" {
		t.Errorf("from files: %q %q %v", k, i, err)
	}
	k, i, err = Config{KernelImage: []byte("k")}.images()
	if err != nil || string(k) != "k" || i != nil {
		t.Errorf("from bytes: %q %q %v", k, i, err)
	}
	if _, _, err := (Config{}).images(); err == nil || !strings.Contains(err.Error(), "Config.Kernel") {
		t.Errorf("no kernel: %v", err)
	}
	if _, _, err := (Config{Kernel: filepath.Join(dir, "missing")}).images(); err == nil {
		t.Error("missing kernel accepted")
	}
	if _, _, err := (Config{Kernel: kernel, Initrd: filepath.Join(dir, "missing")}).images(); err == nil {
		t.Error("missing initrd accepted")
	}
}

func TestVirtioGSIsAvoidLegacyLines(t *testing.T) {
	seen := map[uint32]bool{}
	for _, g := range virtioGSIs {
		switch g {
		case 0, 1, 2, 3, 4, 8, 13:
			t.Errorf("GSI %d belongs to a legacy device", g)
		}
		if g > 23 || seen[g] {
			t.Errorf("GSI %d out of the IOAPIC's range or repeated", g)
		}
		seen[g] = true
	}
}
