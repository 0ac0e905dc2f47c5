//go:build !amd64

package agent

import "errors"

// writePortByte has no I/O ports to write on this architecture.
func writePortByte(port uint16, value uint8) error {
	return errors.New("I/O ports exist only on x86")
}
