// Package devices holds the guest-visible devices of cowork-vmm and the tiny
// contract they share with the VMM: an interrupt line ([IRQ]). Devices log
// guest misbehaviour through internal/ratelog, so that a guest cannot flood
// the host's log.
//
// Sub-packages:
//   - serial: the 8250 UART console (ttyS0).
//   - platform: the i8042 reset path and the boot timer port.
//   - virtio: split virtqueues, descriptor chains, the Device interface and
//     the virtio-mmio transport; virtio/virtiotest plays the guest in tests.
//   - rng, vsock, p9, virtiofs, blk: virtio devices built on package virtio
//     (blk: the profile's writable root disk, a sparse raw image).
//   - hostfs: the export layer the two file-sharing devices (virtiofs, the
//     default, and p9) serve: confined host directories behind a node
//     interface of its own.
//
// A device is a bus device: it has Read(offset, data) and Write(offset, data)
// methods with offsets relative to its base, called concurrently from
// several vCPU threads, so every device is safe for concurrent use. Nothing
// here imports the VMM; the VMM adapts to these shapes structurally.
package devices
