package vm

import (
	"os"
	"testing"
)

// BenchmarkInitramfs makes the initramfs from the test binary (a stand-in
// for the helper's executable): streamed into guest memory as the kvm
// backend does, and gzip-compressed in the helper's memory (the
// CompressInitramfs option); the size goes in a custom metric.
func BenchmarkInitramfs(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("streamed", func(b *testing.B) {
		src, err := newInitramfsSource(exe)
		if err != nil {
			b.Fatal(err)
		}
		mem := make(byteMemory, src.Size())
		for b.Loop() {
			if err := src.WriteTo(mem, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(src.Size())/(1<<20), "MiB")
	})
	b.Run("gzip", func(b *testing.B) {
		var size int
		for b.Loop() {
			img, err := buildGzipInitramfs(exe)
			if err != nil {
				b.Fatal(err)
			}
			size = len(img)
		}
		b.ReportMetric(float64(size)/(1<<20), "MiB")
	})
}
