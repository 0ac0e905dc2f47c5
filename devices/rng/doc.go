// Package rng is the virtio entropy device (virtio-rng, device id 4): it
// fills every writable buffer the driver offers with bytes from
// crypto/rand, up to MaxBytesPerRequest per chain. It is also the smallest
// example of a device built on package virtio.
package rng
