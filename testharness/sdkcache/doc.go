// Package sdkcache finds the real Claude Code CLI that tests and
// benchmarks run: the pinned build (sdk.pin) that scripts/fetch-sdk.sh
// fetched with npm, checked and unpacked into the cache, laid out as the
// desktop client lays out installSdk's files: <dir>/<version>/claude.
package sdkcache
