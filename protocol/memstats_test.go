package protocol

import "runtime"

// memAllocated returns the cumulative bytes allocated by the process.
func memAllocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}
