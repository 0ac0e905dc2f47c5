//go:build linux

// Command testinit is the smallest useful /init for booting our guest
// kernel: it mounts devtmpfs, prints "TESTINIT OK" with the online CPUs and
// the uptime on the console, then "TESTINIT IRQCHIP" with the interrupt
// controller the kernel drives (its chip name: GICv3, GIC-0, IO-APIC),
// writes the boot timer (guesthost.BootTimerMagic to its register, through
// /dev/port on x86 and /dev/mem on arm64: guest/platformreg), prints
// "TESTINIT DONE" and restarts the machine (on x86 with reboot=t a triple
// fault, on arm64 PSCI's SYSTEM_RESET; either ends our VMM's run and qemu
// under -no-reboot).
//
// With guestboot.ticks=N it first prints "TESTINIT TICK i" for i = 1..N,
// 50 ms apart: a guest that keeps time and talks, to snapshot and restore.
//
// With guestboot.fs=WORKLOADS on the kernel command line it first runs the
// file-system benchmark (fs.go; package fsbench is the contract): it mounts
// the shared directory and the host's root, runs each workload, prints a
// "TESTINIT FS" line for each and "TESTINIT FS END".
//
// With guestboot.sdk=PATH it runs the real Claude Code CLI's turns (sdk.go;
// package sdkturn is the contract): it serves a fake Messages API on its
// own loopback, mounts the CLI's directory and the host's root, runs the
// CLI at PATH in the first chrooted in the second, prints a "TESTINIT SDK"
// line for each turn and "TESTINIT SDK END".
//
// Built static (CGO_ENABLED=0) and packed as /init by package guestboot.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cowork-vmm/cowork-vmm/guest/platformreg"
	"github.com/cowork-vmm/cowork-vmm/protocol/guesthost"
)

func main() {
	if err := unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, ""); err != nil {
		fmt.Println("testinit: mount /dev:", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		fmt.Println("testinit: mount /proc:", err)
	}
	if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		fmt.Println("testinit: mount /sys:", err)
	}
	fmt.Printf("TESTINIT OK cpus=%s uptime=%s\n", readTrimmed("/sys/devices/system/cpu/online"), uptime())
	fmt.Printf("TESTINIT IRQCHIP %s\n", interruptController())
	cmdline := readTrimmed("/proc/cmdline")
	ticks(cmdline)
	fsMode(cmdline, os.Stdout)
	sdkMode(cmdline, os.Stdout)
	if err := writeBootTimer(); err != nil {
		fmt.Println("testinit: boot timer:", err)
	}
	fmt.Println("TESTINIT DONE")
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		fmt.Println("testinit: reboot:", err)
	}
	for {
		time.Sleep(time.Hour) // PID 1 must not exit
	}
}

func writeBootTimer() error {
	return platformreg.WriteOnce(platformreg.BootTimer, guesthost.BootTimerMagic)
}

func readTrimmed(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(data))
}

// interruptController names the interrupt controller of the kernel's
// timer interrupt as /proc/interrupts names its chip ("GICv3", "GIC-0"
// for a GICv2, "IO-APIC"): the field after the per-CPU counts of the
// first line that names a timer. "unknown" when there is none.
func interruptController() string {
	data, err := os.ReadFile("/proc/interrupts")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 || !strings.HasSuffix(fields[0], ":") || !strings.Contains(line, "timer") {
			continue
		}
		for _, f := range fields[1:] {
			if _, err := strconv.ParseUint(f, 10, 64); err != nil {
				return f
			}
		}
	}
	return "unknown"
}

func uptime() string {
	if f := strings.Fields(readTrimmed("/proc/uptime")); len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// ticks prints guestboot.ticks=N ticks, 50 ms apart (none without it).
func ticks(cmdline string) {
	for _, f := range strings.Fields(cmdline) {
		v, ok := strings.CutPrefix(f, "guestboot.ticks=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100000 {
			fmt.Println("testinit: bad", f)
			return
		}
		for i := 1; i <= n; i++ {
			time.Sleep(50 * time.Millisecond)
			fmt.Printf("TESTINIT TICK %d uptime=%s\n", i, uptime())
		}
	}
}
