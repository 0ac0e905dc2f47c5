// Package cachedir owns where cowork-vmm keeps what it can rebuild: the
// kernels the build makes, the kernel unpacked from the executable, and
// the test harness's fetched SDK and built bundle, each in a directory of
// its own under the user's cache directory, or where an environment
// variable says.
package cachedir
