#!/usr/bin/env bash
# Fetches the pinned Claude Code CLI (testharness/sdkcache/sdk.pin) with
# `npm pack` from npm's configured registry, checks the tarball's SHA-256
# and unpacks its executable as <cache>/<version>/claude, the layout
# installSdk expects. <cache> is $COWORK_VMM_SDK_CACHE, else
# ${XDG_CACHE_HOME:-~/.cache}/cowork-vmm/sdk. Does nothing when it is there.
# Exits 0 without it when npm is missing (the tests that need it skip and
# say why); fails on a checksum mismatch.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=../testharness/sdkcache/sdk.pin
. testharness/sdkcache/sdk.pin
cache="${COWORK_VMM_SDK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cowork-vmm/sdk}"
dest="$cache/$SDK_VERSION/claude"
if [ -x "$dest" ] && [ "$(cat "$dest.tarball-sha256" 2>/dev/null)" = "$SDK_TARBALL_SHA256" ]; then
	echo "fetch-sdk: $SDK_PACKAGE $SDK_VERSION already at $dest"
	exit 0
fi
if ! command -v npm >/dev/null; then
	echo "fetch-sdk: npm is not installed: the real-SDK tests will skip" >&2
	exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$SDK_PACKAGE@$SDK_VERSION" >/dev/null)
tarball="$(ls "$work"/*.tgz)"
got="$(sha256sum "$tarball" | cut -d' ' -f1)"
if [ "$got" != "$SDK_TARBALL_SHA256" ]; then
	echo "fetch-sdk: $SDK_PACKAGE $SDK_VERSION: tarball SHA-256 $got, want $SDK_TARBALL_SHA256" >&2
	exit 1
fi
tar -xzf "$tarball" -C "$work" package/claude
mkdir -p "$cache/$SDK_VERSION"
install -m 0755 "$work/package/claude" "$dest.tmp"
mv "$dest.tmp" "$dest"
echo "$SDK_TARBALL_SHA256" > "$dest.tarball-sha256"
echo "fetch-sdk: $SDK_PACKAGE $SDK_VERSION at $dest"
