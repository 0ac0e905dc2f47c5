// Package e2e holds the end-to-end test: it starts the built cowork-vmm
// binary as the desktop client does (-socket in a private XDG_RUNTIME_DIR)
// and walks the client's whole flow over real socket connections.
//
// Knobs (environment):
//
//	COWORK_VMM_E2E_BACKEND  backend to test (default "process")
//	COWORK_VMM_E2E_BIN      an already-built binary (default: go build)
package e2e
