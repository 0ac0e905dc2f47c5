// Package ninep is the contract between testinit's 9p throughput mode and
// the host side that boots it (package guestboot): the kernel command line
// words that switch the mode on, the mount options, and the console line
// the guest reports with. It has no dependencies beyond the standard
// library so that testinit, a tiny /init, stays small.
package ninep
