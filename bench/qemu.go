package bench

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/cowork-vmm/cowork-vmm/guest/initramfs"
	"github.com/cowork-vmm/cowork-vmm/helper/backend/vm"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
	"github.com/cowork-vmm/cowork-vmm/vmm/x86"
)

// Boot timer: the guest agent writes guesthost.BootTimerMagic to port
// guesthost.BootTimerPort first thing as /init (guest/agent). Our VMM's
// boot-timer device times it; under qemu an isa-debugcon device on the
// same port forwards the byte to a socket the bench listens on, so both
// are timed to the same instruction of the same init.

// guestCmdline is the kernel command line of the peers: our machine's
// default (machine.DefaultCmdline: console on ttyS0, no PCI probing, no
// timer check, reboot through the keyboard controller), so that the same
// kernel does the same work under every VMM.
const guestCmdline = "console=ttyS0 panic=-1 pci=off no_timer_check quiet reboot=k"

// qemuPeer is one way of booting the guest under qemu.
type qemuPeer struct {
	ID    string
	Label string
	// args returns the machine-specific arguments (machine type, firmware,
	// kernel image); work is the run's directory.
	args func(work string) ([]string, error)
}

// writeInitramfs writes the guest initramfs (uncompressed, as the kvm
// backend boots it) for executable to path.
func writeInitramfs(path, executable string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing the guest initramfs: %w", err)
	}
	if err := initramfs.Write(f, vm.InitramfsFiles(executable)); err != nil {
		f.Close()
		return fmt.Errorf("writing the guest initramfs from %s: %w", executable, err)
	}
	return f.Close()
}

// qemuBoot times one qemu boot of the guest to its /init.
type qemuBoot struct {
	Qemu    string
	Args    []string // machine-specific: from qemuPeer.args
	Initrd  string
	MemMiB  int
	Dir     string
	Timeout time.Duration
	// Accel is "kvm" (the default: what the peers are) or "tcg" (qemu's
	// emulator; tests of the peer machinery on hosts without KVM).
	Accel string
	// Meter, when set, samples qemu's work at the boot timer's byte
	// (runResult.Work[WorkBoot], from qemu's exec: no process, no work).
	Meter *WorkMeter
}

// run boots qemu, waits for the boot-timer byte, samples qemu's memory and
// kills it. start_sent is qemu's exec, init the byte's arrival.
func (q qemuBoot) run(ctx context.Context) (runResult, error) {
	if err := os.MkdirAll(q.Dir, 0o700); err != nil {
		return runResult{}, fmt.Errorf("bench work directory: %w", err)
	}
	sock := filepath.Join(q.Dir, "boottimer.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return runResult{}, fmt.Errorf("boot-timer socket: %w", err)
	}
	defer ln.Close()
	console := filepath.Join(q.Dir, "console.log")
	accel := []string{"-enable-kvm", "-cpu", "host"}
	if q.Accel == "tcg" {
		accel = []string{"-accel", "tcg", "-cpu", "max"}
	}
	args := append(accel,
		"-m", strconv.Itoa(q.MemMiB), "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none",
		"-serial", "file:"+console,
		"-initrd", q.Initrd,
		"-append", guestCmdline,
		"-no-reboot",
		"-chardev", "socket,id=boottimer,path="+sock,
		"-device", fmt.Sprintf("isa-debugcon,iobase=%#x,chardev=boottimer", guesthost.BootTimerPort),
	)
	args = append(args, q.Args...)
	logPath := filepath.Join(q.Dir, "qemu.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return runResult{}, fmt.Errorf("bench work directory: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(q.Qemu, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	tl := NewTimeline()
	started := time.Now()
	tl.Mark(MarkStartSent, started)
	if err := cmd.Start(); err != nil {
		return runResult{}, fmt.Errorf("starting %s: %w", q.Qemu, err)
	}
	var work *bootWork
	if q.Meter != nil {
		work = newBootWork(*q.Meter, cmd.Process.Pid)
		work.set(MarkStartSent, ZeroSample(started))
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()

	boot := make(chan error, 1)
	var bootAt time.Time
	go func() { boot <- readBootTimer(ln, &bootAt, func() { work.mark(MarkInit, true) }) }()
	timer := time.NewTimer(q.Timeout)
	defer timer.Stop()
	select {
	case err := <-boot:
		if err != nil {
			return runResult{}, fmt.Errorf("qemu boot timer: %w%s%s", err, logTail(logPath), logTail(console))
		}
	case err := <-exited:
		exited <- err // for the deferred kill's wait
		return runResult{}, fmt.Errorf("qemu exited before the guest reached /init: %v%s%s", err, logTail(logPath), logTail(console))
	case <-timer.C:
		return runResult{}, fmt.Errorf("the guest did not reach /init under qemu within %v%s%s", q.Timeout, logTail(logPath), logTail(console))
	case <-ctx.Done():
		return runResult{}, ctx.Err()
	}
	tl.Mark(MarkInit, bootAt)
	res := runResult{Phases: tl.Durations(), Work: work.ops()}
	if mem, err := ReadMemory(cmd.Process.Pid, int64(q.MemMiB)<<20); err == nil {
		res.Memory = &mem
	}
	return res, nil
}

// readBootTimer accepts qemu's debugcon connection and returns when the
// boot-timer byte arrives, with its time in *at, after calling arrived.
func readBootTimer(ln net.Listener, at *time.Time, arrived func()) error {
	conn, err := ln.Accept()
	if err != nil {
		return err
	}
	defer conn.Close()
	buf := make([]byte, 64)
	for {
		n, err := conn.Read(buf)
		now := time.Now()
		for _, b := range buf[:n] {
			if b == guesthost.BootTimerMagic {
				*at = now
				arrived()
				return nil
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("qemu closed the boot-timer channel before the guest wrote it")
			}
			return err
		}
	}
}

// qemuPeers returns the peers this host can run, and notes on the ones it
// cannot. vmlinux is the kernel our VMM boots; bzImage (may be empty) the
// same build's compressed image. inHarness leaves q35 + OVMF out unless
// only names it: the harness's emulator aborts during OVMF boots.
func qemuPeers(vmlinux, bzImage string, only map[string]bool, inHarness bool) (peers []qemuPeer, notes []string) {
	want := func(id string) bool { return len(only) == 0 || only[id] }
	if want("microvm") {
		peers = append(peers, qemuPeer{
			ID: SystemQemuMicro, Label: "qemu microvm",
			args: func(string) ([]string, error) {
				return []string{"-M", "microvm,acpi=off", "-kernel", vmlinux}, nil
			},
		})
	}
	if want("q35") {
		peers = append(peers, seabiosQ35(vmlinux, bzImage))
		if bzImage == "" {
			notes = append(notes, "q35 + SeaBIOS boots vmlinux through qemu's PVH option ROM: no bzImage beside "+vmlinux)
		}
	}
	switch {
	case want("ovmf") && inHarness && !only["ovmf"]:
		// Seen with Debian's qemu 7.2 as the outer emulator: of 14 OVMF
		// boots of our kernel (nested KVM inside the emulator), 5 reached
		// the kernel's end of boot, 6 hung, and 3 ended the outer qemu,
		// and with it the whole bench, on "tcg_handle_interrupt:
		// assertion failed: (qemu_mutex_iothread_locked())". SeaBIOS
		// boots of the same kernel never did either.
		notes = append(notes, "no q35 + OVMF row: inside the nested harness most OVMF boots fail (the outer qemu's emulator aborts on an assertion, ending the whole bench, or the guest hangs); --peers ovmf runs it anyway, and hosts with their own KVM run it by default")
	case want("ovmf"):
		p, why := ovmfQ35(bzImage)
		if why != "" {
			notes = append(notes, "no q35 + OVMF row (the official helper's firmware): "+why)
		} else {
			peers = append(peers, p)
		}
	}
	return peers, notes
}

// seabiosQ35 is q35 with qemu's default firmware, which boots the bzImage
// (or vmlinux, through qemu's PVH option ROM).
func seabiosQ35(vmlinux, bzImage string) qemuPeer {
	image := cmp.Or(bzImage, vmlinux)
	return qemuPeer{
		ID: SystemQemuQ35, Label: "qemu q35 + SeaBIOS",
		args: func(string) ([]string, error) { return []string{"-M", "q35", "-kernel", image}, nil },
	}
}

// ovmfQ35 is q35 with Debian's OVMF, the official helper's firmware, or why
// it cannot run here. OVMF starts an EFI-stub kernel as a UEFI program and
// any other relocatable bzImage through its own Linux loader.
func ovmfQ35(bzImage string) (qemuPeer, string) {
	code, vars := findOVMF()
	switch {
	case code == "":
		return qemuPeer{}, "no OVMF firmware found (apt-get install ovmf)"
	case bzImage == "":
		return qemuPeer{}, "OVMF boots only a bzImage, and there is none beside the kernel"
	case !hasEFIStub(bzImage) && !isRelocatable(bzImage):
		return qemuPeer{}, bzImage + " has neither an EFI stub nor CONFIG_RELOCATABLE, and OVMF's Linux loader needs one"
	}
	return qemuPeer{
		ID: SystemQemuQ35OVMF, Label: "qemu q35 + OVMF",
		args: func(work string) ([]string, error) {
			// OVMF writes its variable store: each boot gets a fresh copy.
			vs := filepath.Join(work, "OVMF_VARS.fd")
			if err := copyFile(vs, vars); err != nil {
				return nil, fmt.Errorf("copying the OVMF variable store: %w", err)
			}
			return []string{"-M", "q35",
				"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + code,
				"-drive", "if=pflash,format=raw,unit=1,file=" + vs,
				"-kernel", bzImage}, nil
		},
	}, ""
}

// findOVMF returns Debian's 4 MiB OVMF code and variable template, or "".
func findOVMF() (code, vars string) {
	for _, pair := range [][2]string{
		{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"},
		{"/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd"},
	} {
		if isFile(pair[0]) && isFile(pair[1]) {
			return pair[0], pair[1]
		}
	}
	return "", ""
}

// BzImageBeside returns the bzImage of the same kernel build beside
// vmlinux (what build.sh puts there), or "" when there is none.
func BzImageBeside(vmlinux string) string {
	if bz := filepath.Join(filepath.Dir(vmlinux), "bzImage"); isFile(bz) {
		return bz
	}
	return ""
}

func isFile(p string) bool {
	info, err := os.Stat(p)
	return err == nil && info.Mode().IsRegular()
}

func copyFile(dst, src string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}

// hasEFIStub reports whether a bzImage can be started by UEFI firmware: an
// EFI-stub kernel is also a PE image ("MZ" at 0, "PE\0\0" where the DOS
// header's e_lfanew points).
func hasEFIStub(bzImage string) bool {
	f, err := os.Open(bzImage)
	if err != nil {
		return false
	}
	defer f.Close()
	var hdr [0x40]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil || hdr[0] != 'M' || hdr[1] != 'Z' {
		return false
	}
	off := int64(binary.LittleEndian.Uint32(hdr[0x3c:]))
	var sig [4]byte
	if _, err := f.ReadAt(sig[:], off); err != nil {
		return false
	}
	return sig == [4]byte{'P', 'E', 0, 0}
}

// isRelocatable reports whether a bzImage says it can run at any address
// (the setup header's relocatable_kernel, boot protocol 2.05 and later),
// which OVMF's Linux loader requires of a kernel without an EFI stub.
func isRelocatable(bzImage string) bool {
	f, err := os.Open(bzImage)
	if err != nil {
		return false
	}
	defer f.Close()
	var hdr [x86.SHRelocatable + 1]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return false
	}
	le := binary.LittleEndian
	return le.Uint32(hdr[x86.SHHeader:]) == x86.HeaderMagic &&
		le.Uint16(hdr[x86.SHVersion:]) >= minRelocatableVersion &&
		hdr[x86.SHRelocatable] != 0
}

// minRelocatableVersion is boot protocol 2.05, the first with
// relocatable_kernel.
const minRelocatableVersion = 0x0205
