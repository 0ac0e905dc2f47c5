package machine

import "github.com/cowork-vmm/cowork-vmm/devices/platform"

// DefaultCmdline is the kernel command line every machine starts from.
// Each word is there for a reason:
//   - console=ttyS0: the kernel console on our 8250 (COM1).
//   - panic=-1: reboot at once on panic, which ends the VM (no hang).
//   - reboot=k (from platform.KernelCmdline): reboot through the i8042,
//     our reset path; i8042.noaux/nomux/nopnp/dumbkbd: no mouse port,
//     multiplexer, PnP or LED probing, each a round of port I/O exits.
//   - pci=off: there is no PCI bus; probing 0xcf8/0xcfc costs exits.
//   - no_timer_check: skip the IO-APIC timer sanity check, which waits for
//     ticks and can misjudge a virtual timer under nested virtualisation.
//   - quiet: every console byte is two or more port I/O exits (~50 µs each
//     nested); boot messages would dominate boot time. Append loglevel=7
//     to see them.
//   - i8042.nokbd: the i8042 stays (its reset line is our reboot path) but
//     the driver registers no keyboard port, so atkbd never probes one: its
//     reset/ID commands wait out timeouts, ~4 s of a nested boot (measured,
//     testharness/nested TestNestedBootGuestKernel). The console is the serial
//     port; nothing reads a keyboard.
//   - initcall_blacklist=cmos_init: there is no CMOS RTC (port 0x71 reads
//     0xff, update-in-progress set), and rtc-cmos polls it for a second of
//     guest time through ~10,000 port exits before it gives up, ~4 s nested.
//     The wall clock comes from kvm-clock instead.
const DefaultCmdline = "console=ttyS0 panic=-1 pci=off no_timer_check quiet " +
	"i8042.nokbd initcall_blacklist=cmos_init " + platform.KernelCmdline
