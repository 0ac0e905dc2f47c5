// Package vsocktest plays a Linux guest's vsock stack against a
// vsock.Device, through virtiotest's guest-side virtio driver: it posts rx
// buffers, writes tx packets as the Linux virtio transport does (REQUEST,
// RW, CREDIT_UPDATE, SHUTDOWN, RST), honours the host's credit and checks
// that the host honours ours. Tests of the device and of code built on it
// (the agent channel, egress) use it as "the guest".
//
// Typical use:
//
//	dev, _ := vsock.New(vsock.Config{GuestCID: 42})
//	l, _ := dev.Listen(1024)               // the host side
//	g := vsocktest.Start(t, dev, vsocktest.Options{})
//	gc, err := g.Dial(1024, time.Second)   // the guest connects
//	host, _ := l.Accept()
//	// gc and host are the two ends; g.Errors() lists protocol
//	// violations the host committed.
package vsocktest
