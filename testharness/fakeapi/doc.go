// Package fakeapi is a stand-in for the Anthropic Messages API that tests
// point the real Claude Code CLI at (ANTHROPIC_BASE_URL): it answers POST
// /v1/messages, streamed (server-sent events) or not, with a text that
// names the last user message it was sent, and records every request. It
// serves only what a print-mode or stream-json turn needs; anything else
// gets a 404 the CLI treats as a missing optional endpoint.
package fakeapi
