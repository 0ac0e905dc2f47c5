#!/usr/bin/env bash
# Fetches the arm64 userland of the nested harness's arm64 outer guest:
# Debian's busybox-static:arm64, unpacked as <cache>/<version>/root (the
# package's files; bin/busybox is the static arm64 busybox) with
# <cache>/current naming the latest. <cache> is
# $COWORK_VMM_ARM64_USERLAND, else
# ${XDG_CACHE_HOME:-~/.cache}/cowork-vmm/arm64-userland. Does nothing when
# the candidate version is there. Needs root (or sudo) for
# `dpkg --add-architecture arm64` and `apt-get update`, and the configured
# Debian mirror; without them it fails saying why, and the arm64 nested
# tests skip saying the userland is missing.
set -euo pipefail
cache="${COWORK_VMM_ARM64_USERLAND:-${XDG_CACHE_HOME:-$HOME/.cache}/cowork-vmm/arm64-userland}"
pkg=busybox-static:arm64
if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
	echo "arm64-userland: adding the arm64 architecture to dpkg"
	$SUDO dpkg --add-architecture arm64
	$SUDO apt-get update -qq
fi
version="$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')"
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
	$SUDO apt-get update -qq
	version="$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')"
fi
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
	echo "arm64-userland: apt knows no $pkg (is the arm64 architecture in the apt sources?)" >&2
	exit 1
fi
# The epoch's colon is awkward in paths.
key="${version//:/_}"
dest="$cache/$key"
if [ -x "$dest/root/bin/busybox" ]; then
	ln -sfn "$key" "$cache/current"
	echo "arm64-userland: $pkg $version already at $dest"
	exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work" # apt-get download runs as _apt where it can
(cd "$work" && apt-get download -qq "$pkg=$version")
deb="$(ls "$work"/*.deb)"
mkdir -p "$cache"
rm -rf "$dest.tmp" "$dest"
mkdir -p "$dest.tmp/root"
dpkg-deb -x "$deb" "$dest.tmp/root"
# ELF e_machine 0xb7: AArch64.
machine="$(od -An -tx1 -j18 -N2 "$dest.tmp/root/bin/busybox" | tr -d ' \n')"
if [ "$machine" != "b700" ]; then
	rm -rf "$dest.tmp"
	echo "arm64-userland: $deb holds no arm64 bin/busybox (ELF machine bytes: $machine)" >&2
	exit 1
fi
mv "$dest.tmp" "$dest"
ln -sfn "$key" "$cache/current"
echo "arm64-userland: $pkg $version at $dest"
