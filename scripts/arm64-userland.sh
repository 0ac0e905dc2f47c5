#!/usr/bin/env bash
# Fetches the arm64 userland of the nested harness's arm64 outer guest: the
# arm64 dependency closure of $packages (Debian's busybox-static, curl,
# ca-certificates, qemu-system-arm), unpacked into <cache>/<key>/root with
# <cache>/current naming the latest. The harness shares that root read-only
# into the outer guest (virtio-9p), where outerinit lays a tmpfs over it
# and links busybox's applets for what the packages do not provide.
#
# <cache> is $COWORK_VMM_ARM64_USERLAND, else
# ${XDG_CACHE_HOME:-~/.cache}/cowork-vmm/arm64-userland. <key> hashes the
# package list, every package's version and $format, so a new version or
# list makes a new root; the script does nothing when the root of the key
# is there. Needs root (or sudo) for `dpkg --add-architecture arm64` and
# `apt-get update`, and the configured Debian mirror; without them it
# fails saying why, and the arm64 nested tests skip saying the userland is
# missing.
#
# The root is made without dpkg: packages only its maintainer scripts need
# ($skip) are left out with what only they pull in, no maintainer script
# runs (ca-certificates' bundle is concatenated here instead), and the root
# follows Debian's merged /usr (bin, sbin and lib are links into usr, so
# /lib/ld-linux-aarch64.so.1 resolves whichever the package shipped).
set -euo pipefail
cache="${COWORK_VMM_ARM64_USERLAND:-${XDG_CACHE_HOME:-$HOME/.cache}/cowork-vmm/arm64-userland}"
packages=(busybox-static:arm64 curl:arm64 ca-certificates qemu-system-arm:arm64)
# Needed by dpkg's maintainer scripts or for logins only, never at run time
# by the programs above.
skip=" adduser debconf debconf-2.0 cdebconf dpkg install-info passwd perl-base openssl tar libpam-modules libpam-modules-bin libpam0g "
# Bump when the way the root is assembled changes.
format=2
if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
log() { echo "arm64-userland: $*"; }

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
	log "adding the arm64 architecture to dpkg"
	$SUDO dpkg --add-architecture arm64
	$SUDO apt-get update -qq
fi
if ! apt-cache show busybox-static:arm64 >/dev/null 2>&1; then
	$SUDO apt-get update -qq
fi
if ! apt-cache show busybox-static:arm64 >/dev/null 2>&1; then
	echo "arm64-userland: apt knows no busybox-static:arm64 (is the arm64 architecture in the apt sources?)" >&2
	exit 1
fi

# apt-cache in a loop: with a binary cache of its own, since apt
# configurations for containers turn the shared one off
# (Dir::Cache::pkgcache ""), and then every call parses every package list
# again (1.8 s a call here instead of 0.4 s).
aptcache="$(mktemp -d)"
trap 'rm -rf "$aptcache"' EXIT
aptc() {
	apt-cache -o Dir::Cache::pkgcache="$aptcache/pkgcache.bin" \
		-o Dir::Cache::srcpkgcache="$aptcache/srcpkgcache.bin" "$@"
}

# deps_of prints the direct run-time dependencies of its arguments, one a
# line: the first of each group of alternatives, the first provider of a
# virtual package.
deps_of() {
	aptc depends --no-recommends --no-suggests --no-conflicts --no-breaks \
		--no-replaces --no-enhances "$@" 2>/dev/null | awk '
		/^ [ |](Pre)?Depends: / {
			take = !alt; alt = ($0 ~ /^ \|/); provider = 0
			if (!take) next
			if ($2 ~ /^</) { provider = 1; next }
			print $2; next
		}
		/^    / { if (provider) { print $1; provider = 0 } }'
}

# arm64_names maps the names apt printed to the packages to install in an
# arm64 root: name:arm64 stays; a plain name is an Architecture: all
# package, kept as is, or a native one (a dependency of an all package),
# taken as name:arm64.
arm64_names() {
	local plain=()
	for n in "$@"; do
		case "$n" in *:arm64) echo "$n" ;; *) plain+=("$n") ;; esac
	done
	[ "${#plain[@]}" -gt 0 ] || return 0
	aptc show --no-all-versions "${plain[@]}" 2>/dev/null | awk '
		/^Package: / { p = $2 }
		/^Architecture: / { if ($2 == "all") print p; else print p ":arm64" }'
}

declare -A seen=()
closure=()
mapfile -t level < <(arm64_names "${packages[@]}")
while [ "${#level[@]}" -gt 0 ]; do
	next=()
	for p in "${level[@]}"; do
		[[ "$skip" == *" ${p%:arm64} "* ]] && continue
		[ -n "${seen[$p]:-}" ] && continue
		seen[$p]=1
		closure+=("$p")
		next+=("$p")
	done
	[ "${#next[@]}" -gt 0 ] || break
	mapfile -t level < <(arm64_names $(deps_of "${next[@]}" | sort -u))
done

# name=version of each package, sorted: the key and the download list.
mapfile -t pinned < <(aptc show --no-all-versions "${closure[@]}" | awk '
	/^Package: / { p = $2 } /^Architecture: / { a = $2 }
	/^Version: / { v = $2 }
	/^$/ { if (p != "") { if (a == "all") print p "=" v; else print p ":" a "=" v }; p = "" }
	END { if (p != "") { if (a == "all") print p "=" v; else print p ":" a "=" v } }' | sort -u)
for p in "${pinned[@]}"; do
	arch="${p%%=*}"
	if [[ "$arch" == *:* && "$arch" != *:arm64 ]]; then
		echo "arm64-userland: the closure holds $p, neither arm64 nor Architecture: all" >&2
		exit 1
	fi
done
key="$( (echo "format=$format"; printf '%s\n' "${pinned[@]}") | sha256sum | cut -c1-16)"
dest="$cache/$key"
if [ -x "$dest/root/usr/bin/busybox" ] && [ -x "$dest/root/usr/bin/curl" ]; then
	ln -sfn "$key" "$cache/current"
	log "${#pinned[@]} packages already at $dest"
	exit 0
fi

# The .debs stay in <cache>/debs: a new key downloads only what changed.
debs="$cache/debs"
mkdir -p "$debs"
chmod 0755 "$cache" "$debs" # apt-get download runs as _apt where it can
t0=$(date +%s.%N)
(cd "$debs" && apt-get download -qq "${pinned[@]}" 2>&1 | grep -v 'unsandboxed as root' || true)
t1=$(date +%s.%N)
rm -rf "$dest.tmp" "$dest"
root="$dest.tmp/root"
mkdir -p "$root"
for p in "${pinned[@]}"; do
	name="${p%%=*}" version="${p#*=}"
	# apt-get download names a file name_version_arch.deb, the epoch's
	# colon as %3a.
	deb="$(ls "$debs/${name%:arm64}_${version//:/%3a}"_*.deb)"
	dpkg-deb -x "$deb" "$root"
done
# Merged /usr: move what packages shipped in /bin, /sbin and /lib into usr
# and leave links in their place.
for d in bin sbin lib; do
	mkdir -p "$root/usr/$d"
	if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then
		cp -a "$root/$d/." "$root/usr/$d/"
		rm -rf "${root:?}/$d"
	fi
	ln -sfn "usr/$d" "$root/$d"
done
# No man pages, docs or translations: nothing runs them, and every byte is
# shared over emulated 9p.
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/locale"
# ca-certificates' postinst would build this bundle; curl reads it.
mkdir -p "$root/etc/ssl/certs"
find "$root/usr/share/ca-certificates" -name '*.crt' -print0 | sort -z |
	xargs -0 -r cat >"$root/etc/ssl/certs/ca-certificates.crt"
t2=$(date +%s.%N)
for bin in usr/bin/busybox usr/bin/curl usr/bin/qemu-system-aarch64 usr/lib/ld-linux-aarch64.so.1; do
	# ELF e_machine 0xb7: AArch64.
	machine="$(od -An -tx1 -j18 -N2 "$root/$bin" 2>/dev/null | tr -d ' \n')"
	if [ "$machine" != "b700" ]; then
		rm -rf "$dest.tmp"
		echo "arm64-userland: the root holds no arm64 $bin (ELF machine bytes: ${machine:-none})" >&2
		exit 1
	fi
done
printf '%s\n' "${pinned[@]}" >"$dest.tmp/packages"
mv "$dest.tmp" "$dest"
ln -sfn "$key" "$cache/current"
size="$(du -sh "$dest/root" | cut -f1)"
log "${#pinned[@]} packages at $dest: root $size; download $(echo "$t1 - $t0" | bc)s, unpack $(echo "$t2 - $t1" | bc)s"
