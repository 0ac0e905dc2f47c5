package vm

import (
	"os"
	"testing"
)

// BenchmarkInitramfs builds the initramfs from the test binary (a
// stand-in for the helper's executable), plain and gzip-compressed; the
// size goes in the bytes/op-style custom metric.
func BenchmarkInitramfs(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		compress bool
	}{{"plain", false}, {"gzip", true}} {
		b.Run(tc.name, func(b *testing.B) {
			var size int
			for b.Loop() {
				img, err := buildInitramfs(exe, tc.compress)
				if err != nil {
					b.Fatal(err)
				}
				size = len(img)
			}
			b.ReportMetric(float64(size)/(1<<20), "MiB")
		})
	}
}
