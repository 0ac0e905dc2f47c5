// Package acceptloop is the one accept loop of the helper's servers (the
// client socket's protocol.Server and the guest's egress.Server, issue #20):
// accept, hand the connection on, and on a transient failure — the process
// out of descriptors (EMFILE, ENFILE), a connection aborted before it was
// accepted (ECONNABORTED), and the like — log (rate-limited), back off and
// retry instead of ending the server; stop when the context ends.
//
// acceptlooptest holds a listener double whose Accept fails as scripted.
package acceptloop
