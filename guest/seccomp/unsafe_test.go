package seccomp

import "unsafe"

// unsafePtr is b's first byte's address, for raw system calls in tests.
func unsafePtr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
