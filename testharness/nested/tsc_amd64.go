package nested

// rdtsc reads the host CPU's time-stamp counter: what qemu's TCG returns
// for the outer guest's RDTSC.
func rdtsc() uint64

const haveTSC = true
