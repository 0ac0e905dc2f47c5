// Package platform holds the small PC port devices a microVM needs besides
// its console: the i8042 keyboard controller, only so far as Linux needs to
// probe it and to reset the machine through it (command 0xFE), the boot
// timer port the guest agent writes when it starts, the snapshot point
// port through which the agent waits while the VMM snapshots it and learns
// whether it was restored, and an exit port for test guests. The ports and
// bytes the guest uses are protocol/guesthost's, shared with the agent.
package platform
