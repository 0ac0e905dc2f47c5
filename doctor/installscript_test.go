package doctor

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The install script and doctor must agree on the backup's name.
func TestInstallScriptBackupSuffix(t *testing.T) {
	script := installScript(t)
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "BACKUP_SUFFIX="+BackupSuffix+"\n") ||
		!strings.Contains(string(b), "MODULE="+ModulePath+"\n") {
		t.Errorf("%s does not use BACKUP_SUFFIX=%s and MODULE=%s", script, BackupSuffix, ModulePath)
	}
}

func installScript(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "scripts", "install-client-helper.sh")
}

// TestInstallScript runs install, client update, re-install and restore
// against a fake client directory.
func TestInstallScript(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	script := installScript(t)
	dir := t.TempDir()
	res := filepath.Join(dir, "resources")
	if err := os.Mkdir(res, 0o755); err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(res, "cowork-linux-helper")
	backup := helper + BackupSuffix
	write := func(p, content string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	ours := "#!/bin/sh\n# " + ModulePath + "\necho cowork-vmm test\n"
	src := filepath.Join(dir, "cowork-vmm")
	write(src, ours)
	write(helper, "official v1")
	sh := func(wantOK bool, args ...string) string {
		t.Helper()
		cmd := exec.Command("sh", append([]string{script, "--helper", helper}, args...)...)
		out, err := cmd.CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("%v: err %v, want ok=%v\n%s", args, err, wantOK, out)
		}
		return string(out)
	}

	if out := sh(true, "status"); !strings.Contains(out, "is not cowork-vmm") {
		t.Errorf("status before install: %s", out)
	}
	// A dry run changes nothing.
	sh(true, "--dry-run", "install", src)
	if read(helper) != "official v1" || read(backup) != "<"+readErr(backup)+">" {
		t.Fatalf("dry run changed files: helper %q, backup %q", read(helper), read(backup))
	}
	// Install keeps the official helper and puts ours in place.
	sh(true, "install", src)
	if read(helper) != ours || read(backup) != "official v1" {
		t.Fatalf("after install: helper %q, backup %q", read(helper), read(backup))
	}
	if info, err := os.Stat(helper); err != nil || info.Mode().Perm() != 0o755 {
		t.Errorf("installed helper: %v, %v; want mode 0755", info, err)
	}
	if out := sh(true, "status"); !strings.Contains(out, "is cowork-vmm") || !strings.Contains(out, backup) {
		t.Errorf("status after install: %s", out)
	}
	// Installing again never replaces the backup with our own binary.
	sh(true, "install", src)
	if read(backup) != "official v1" {
		t.Fatalf("re-install overwrote the backup: %q", read(backup))
	}
	// A client update puts a new official helper back; install keeps that.
	write(helper, "official v2")
	sh(true, "install", src)
	if read(helper) != ours || read(backup) != "official v2" {
		t.Fatalf("after update + install: helper %q, backup %q", read(helper), read(backup))
	}
	// Something that is not cowork-vmm is refused.
	notOurs := filepath.Join(dir, "other")
	write(notOurs, "#!/bin/sh\necho hi\n")
	sh(false, "install", notOurs)
	if read(helper) != ours {
		t.Fatalf("refused install changed the helper: %q", read(helper))
	}
	// Restore puts the official helper back and drops the backup.
	sh(true, "restore")
	if read(helper) != "official v2" || read(backup) != "<"+readErr(backup)+">" {
		t.Fatalf("after restore: helper %q, backup %q", read(helper), read(backup))
	}
	sh(false, "restore") // no backup any more
	// Restore never replaces an official helper a client update put back.
	write(backup, "official v1")
	sh(false, "restore")
	if read(helper) != "official v2" || read(backup) != "official v1" {
		t.Fatalf("restore over an official helper changed files: helper %q, backup %q", read(helper), read(backup))
	}
	// No client installed: a clear refusal.
	sh(false, "--helper", filepath.Join(dir, "nope", "cowork-linux-helper"), "install", src)
	// No leftover temporary files.
	entries, _ := os.ReadDir(res)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp.") {
			t.Errorf("leftover %s", e.Name())
		}
	}
}

func readErr(p string) string {
	_, err := os.ReadFile(p)
	if err == nil {
		return ""
	}
	return err.Error()
}
