package guestboot

import (
	"bufio"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cowork-vmm/cowork-vmm/internal/nested/guestboot/ninep"
)

// EnvNinePMiB sets the file size of TestThroughput9p in MiB (default
// DefaultNinePMiB).
const EnvNinePMiB = "GUESTBOOT_9P_MIB"

// DefaultNinePMiB keeps a nested run of TestThroughput9p (six guests, each
// writing and reading the file) within a few minutes.
const DefaultNinePMiB = 64

// NinePFigure is one 9p throughput run of the test guest on one VMM.
type NinePFigure struct {
	VMM    string // "cowork-vmm" or "qemu-microvm"
	Run    int    // 1-based, in the order the runs were made
	Result ninep.Result
	// Window is the wall time from testinit's ready line to its 9p line
	// (the mount, the I/O and the content check) and Busy the CPU time
	// the machine running the VMM (the outer guest, all its CPUs) spent
	// busy meanwhile, from /proc/stat: Window-Busy is time nothing ran,
	// i.e. latency rather than work. Zero when not measured.
	Window, Busy time.Duration
}

const ninePFigureMarker = "NINEPFIGURE "

// FigureLine formats f as the line the host-side test parses. The MB/s
// fields are derived, for the reader; the parser ignores them.
func (f NinePFigure) FigureLine() string {
	r := f.Result
	return fmt.Sprintf("%svmm=%s run=%d bytes=%d write_ns=%d read_ns=%d msize=%d window_ms=%d busy_ms=%d write_MBps=%.1f read_MBps=%.1f",
		ninePFigureMarker, f.VMM, f.Run, r.Bytes, r.Write.Nanoseconds(), r.Read.Nanoseconds(), r.Msize,
		f.Window.Milliseconds(), f.Busy.Milliseconds(), r.WriteMBps(), r.ReadMBps())
}

// ParseNinePFigureLine parses a FigureLine (possibly with a prefix).
func ParseNinePFigureLine(line string) (NinePFigure, bool) {
	i := strings.Index(line, ninePFigureMarker)
	if i < 0 {
		return NinePFigure{}, false
	}
	var f NinePFigure
	for _, field := range strings.Fields(line[i+len(ninePFigureMarker):]) {
		key, value, ok := strings.Cut(field, "=")
		if !ok {
			return NinePFigure{}, false
		}
		if key == "vmm" {
			f.VMM = value
			continue
		}
		if key == "write_MBps" || key == "read_MBps" {
			continue
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 {
			return NinePFigure{}, false
		}
		switch key {
		case "run":
			f.Run = int(n)
		case "bytes":
			f.Result.Bytes = n
		case "write_ns":
			f.Result.Write = time.Duration(n)
		case "read_ns":
			f.Result.Read = time.Duration(n)
		case "msize":
			f.Result.Msize = int(n)
		case "window_ms":
			f.Window = time.Duration(n) * time.Millisecond
		case "busy_ms":
			f.Busy = time.Duration(n) * time.Millisecond
		}
	}
	return f, f.VMM != "" && f.Result.Bytes > 0
}

// NinePResult finds testinit's 9p result in a console transcript. It fails
// when there is none, when it is malformed, or when the guest reported an
// error.
func NinePResult(console string) (ninep.Result, error) {
	sc := bufio.NewScanner(strings.NewReader(console))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		r, ok, err := ninep.ParseLine(sc.Text())
		switch {
		case !ok:
			continue
		case err != nil:
			return r, err
		case r.Err != "":
			return r, fmt.Errorf("the guest's 9p test failed: %s", r.Err)
		}
		return r, nil
	}
	return ninep.Result{}, errors.New("the guest printed no 9p result line (" + ninep.Marker + ")")
}

// QemuNineMachine is qemu's -M for the 9p runs. Without acpi=off microvm
// puts its virtio-mmio interrupts on a second IO-APIC that only its ACPI
// tables describe; our guest kernel has no ACPI, so the device's interrupt
// cannot be set up and the 9p mount fails ("no channels available"). Our
// VMM has no ACPI either: this is the like-for-like machine.
const QemuNineMachine = "microvm,acpi=off"

// QemuNinePArgs are the qemu arguments exporting hostDir read-write as a
// virtio-9p device (virtio-mmio on microvm) with this mount tag.
func QemuNinePArgs(hostDir, tag string) ([]string, error) {
	if strings.Contains(hostDir, ",") || strings.Contains(tag, ",") {
		return nil, fmt.Errorf("qemu -fsdev cannot take %q / %q: commas separate its options", hostDir, tag)
	}
	return []string{
		"-fsdev", "local,id=ninepbench,path=" + hostDir + ",security_model=none",
		"-device", "virtio-9p-device,fsdev=ninepbench,mount_tag=" + tag,
	}, nil
}
