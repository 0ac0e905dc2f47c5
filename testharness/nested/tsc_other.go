//go:build !amd64

package nested

func rdtsc() uint64 { return 0 }

const haveTSC = false
