//go:build race

package e2e

// raceEnabled: the test runs under -race, so the helper is built with it too.
const raceEnabled = true
