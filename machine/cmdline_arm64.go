package machine

// DefaultCmdline is the kernel command line every arm64 machine starts
// from:
//   - console=ttyS0: the kernel console on our 16550 on MMIO, which the
//     device tree announces (the 8250 driver's of_serial names it ttyS0).
//   - panic=-1: reboot at once on panic; PSCI's SYSTEM_RESET ends the VM.
//   - quiet: every console byte is an MMIO exit; append loglevel=7 to see
//     the boot messages.
//
// The x86 words (pci=off, i8042, CMOS) have nothing to act on here: the
// device tree lists no PCI host, keyboard controller or RTC.
const DefaultCmdline = "console=ttyS0 panic=-1 quiet"
