// Package timerslack sets the timer slack of a Go program's threads, for
// the Go programs that run inside a guest: the agent (/init of the VM) and
// the benchmarks' test /init.
//
// Why: the Go runtime's sysmon thread sleeps 20 µs at a time while a
// goroutine is in a system call, so a Go program that spends its time in
// system calls asks the guest kernel for a timer interrupt every 20 µs.
// In a VM each is several exits (the timer's expiry, the interrupt window,
// the re-armed TSC deadline); nested, measured, the agent's set-up took
// 700–1000 local timer interrupts a second against the tick's 250. With a
// slack of one tick on every thread (Raise), the kernel serves those
// sleeps with the tick's own interrupts. A thread inherits the slack of
// the thread that starts it, and so does a process: what such a program
// starts runs under WithDefault to get the kernel's default back.
package timerslack
