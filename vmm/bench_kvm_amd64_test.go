package vmm

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cowork-vmm/cowork-vmm/testharness/nested"
)

// BenchmarkKVMSetup measures the VMM's set-up time: from opening /dev/kvm
// (New) to the guest's first exit back to the VMM, i.e. through the first
// KVM_RUN, for a 1-vCPU, 256 MiB VM.
func BenchmarkKVMSetup(b *testing.B) {
	nested.RequireKVM(b)
	var total time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		vm := newTestVM(b, 1, 256<<20)
		load(b, vm.Memory(), codeAddr, []byte{0xe6, portData, 0xeb, 0xfe}) // out 0x10, al; jmp $
		realMode(b, vm.VCPU(0), codeAddr)
		if err := vm.Start(); err != nil {
			b.Fatal(err)
		}
		waitWrote(b, vm.data)
		total += time.Since(start)
		if _, err := vm.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-to-first-exit")
}

// BenchmarkKVMRSS reports the VMM process's resident memory while a 256 MiB
// guest runs a tiny program: the VMM's own overhead, since the guest touches
// only a few pages.
func BenchmarkKVMRSS(b *testing.B) {
	nested.RequireKVM(b)
	var rss, before uint64
	for i := 0; i < b.N; i++ {
		before = residentKiB(b)
		vm := newTestVM(b, 1, 256<<20)
		load(b, vm.Memory(), codeAddr, []byte{0xe6, portData, 0xeb, 0xfe})
		realMode(b, vm.VCPU(0), codeAddr)
		if err := vm.Start(); err != nil {
			b.Fatal(err)
		}
		waitWrote(b, vm.data)
		rss = residentKiB(b)
		if _, err := vm.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rss)/1024, "RSS-MiB")
	b.ReportMetric(float64(int64(rss)-int64(before))/1024, "RSS-growth-MiB")
}

// residentKiB reads VmRSS from /proc/self/status.
func residentKiB(b *testing.B) uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}
