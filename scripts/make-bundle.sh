#!/usr/bin/env bash
# Build the stand-in VM bundle that tests and CI boot in place of the
# desktop client's (issue #41): a directory holding
#
#   rootfs.img  a sparse raw disk with a GPT laid out as the client's image:
#               partition 14 BIOS boot (4 MiB) and 15 EFI system (vfat
#               "UEFI", 100 MiB) first on disk, then partition 1, ext4
#               labelled cloudimg-rootfs, holding a minimal Debian userland
#               (the host's release, from the mirror apt is configured with);
#   data.img    a bare ext4 filesystem labelled cowork-data, which the root
#               image's /etc/fstab mounts by label at /opt/cowork-data;
#   bundle.txt  what was built, from what.
#
# The userland holds what the host does not: /usr/local/bin/cowork-bundle-tool,
# /etc/cowork-bundle-marker, the python module cowork_bundle in dist-packages,
# a user "cowork" (uid 1000) and the host name cowork-bundle in /etc/hostname
# and /etc/hosts. testharness/bundle holds the same names as
# Go constants; its layout test checks that the two agree.
#
#   scripts/make-bundle.sh           # build (or find) the bundle in the cache
#   scripts/make-bundle.sh OUTDIR    # the same, then a sparse copy in OUTDIR
#
# Output: $BUNDLE_CACHE/<hash>/ and the symlink $BUNDLE_CACHE/current to it;
# the bundle's path is the last line printed. <hash> is the sha256 of this
# script, the package list and the Debian release, so a rebuild happens only
# when one of them changes (FORCE=1 rebuilds anyway).
#
# Environment: BUNDLE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/cowork-vmm/bundles),
# BUNDLE_RELEASE (default the host's VERSION_CODENAME), FORCE, BUNDLE_OWNER
# (uid:gid to give the output to; set when re-run through sudo). Old builds
# stay in the cache until removed by hand.
#
# Needs root (mmdebstrap --mode=root, chroot): as another user it re-runs
# itself with `sudo -n` and gives the output back to that user, or fails
# saying so. mmdebstrap's unshare mode is not used: its files belong to
# sub-uids that mkfs.ext4 -d would copy as they are and the caller could not
# delete (e2fsprogs 1.47.1's mkfs.ext4 -d of a tarball would lift that).
set -euo pipefail

# What sessions need to be tested: a shell, python3 with pip, git, sudo,
# apt and dpkg (in minbase), CA certificates.
packages=(bash coreutils python3 python3-pip git sudo ca-certificates)

root_mib=1024 # partition 1: the userland (~350 MiB) plus room for apt installs
bios_mib=4    # partition 14
esp_mib=100   # partition 15
data_mib=16   # data.img

root_label=cloudimg-rootfs
esp_label=UEFI
data_label=cowork-data
data_mount=/opt/cowork-data
marker_text='cowork-vmm stand-in bundle'
data_marker_text='cowork-vmm stand-in data image'
tool_text='cowork-bundle-tool: running from the stand-in bundle'
session_user=cowork
hostname=cowork-bundle

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"
outdir=${1:-}
BUNDLE_CACHE=${BUNDLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cowork-vmm/bundles}
export BUNDLE_CACHE

log() { echo "make-bundle.sh: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

case "$outdir" in -h | --help)
	sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
esac

host_release() {
	# shellcheck disable=SC1091
	(. /etc/os-release && [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}")
}
release=${BUNDLE_RELEASE:-$(host_release)}
[ -n "$release" ] || die "not a Debian host (/etc/os-release): set BUNDLE_RELEASE and configure a Debian mirror in apt"

hash=$(
	{
		echo "release=$release packages=${packages[*]}"
		cat "$self"
	} | sha256sum | cut -c1-16
)
out="$BUNDLE_CACHE/$hash"
current="$BUNDLE_CACHE/current"

# publish links current to the built bundle, copies it to OUTDIR if asked,
# and prints its path.
publish() {
	ln -sfn "$hash" "$current"
	local dir=$out
	if [ -n "$outdir" ]; then
		mkdir -p "$outdir"
		if ! cmp -s "$out/bundle.txt" "$outdir/bundle.txt"; then
			log "copying the bundle into $outdir"
			rm -f "$outdir/bundle.txt"
			cp --sparse=always "$out/rootfs.img" "$out/data.img" "$outdir/"
			cp "$out/bundle.txt" "$outdir/"
		fi
		dir=$(cd "$outdir" && pwd)
	fi
	echo "$dir"
}

if [ -z "${FORCE:-}" ] && [ -f "$out/bundle.txt" ]; then
	log "up to date"
	publish
	exit 0
fi

if [ "$(id -u)" != 0 ]; then
	# shellcheck disable=SC2015 # die unless both hold
	command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
		die "building needs root (mmdebstrap --mode=root, chroot) and sudo -n is not allowed here; run:
  sudo BUNDLE_CACHE='$BUNDLE_CACHE' BUNDLE_OWNER=$(id -u):$(id -g) $self $outdir"
	# The cache and its lock stay the caller's (root makes only the build).
	mkdir -p "$BUNDLE_CACHE"
	touch "$BUNDLE_CACHE/.lock"
	log "re-running as root with sudo -n"
	exec sudo -n env BUNDLE_CACHE="$BUNDLE_CACHE" BUNDLE_RELEASE="$release" FORCE="${FORCE:-}" \
		BUNDLE_OWNER="$(id -u):$(id -g)" "$self" "$@"
fi

# --- dependencies -------------------------------------------------------------
declare -A tool_pkg=([mmdebstrap]=mmdebstrap [sfdisk]=fdisk [mkfs.ext4]=e2fsprogs [mkfs.vfat]=dosfstools)
missing=()
for tool in "${!tool_pkg[@]}"; do
	command -v "$tool" >/dev/null || missing+=("${tool_pkg[$tool]}")
done
if ((${#missing[@]})); then
	log "installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- the mirror apt is configured with ------------------------------------------

# apt_sources prints apt's configured sources as one-line entries
# ("deb [signed-by=K] URI SUITE COMPONENT..."), from sources.list, *.list and
# deb822 *.sources files alike.
apt_sources() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] && sed -e 's/#.*//' -e '/^[[:space:]]*deb[[:space:]]/!d' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] && deb822_to_lines <"$f"
	done
	return 0
}

# deb822_to_lines turns the stanzas of a .sources file into one-line
# entries: one per URI and suite of each enabled "deb" stanza.
deb822_to_lines() {
	awk '
	function flush(  u, s, nu, ns, i, j, opt) {
		if (f["types"] ~ /(^| )deb( |$)/ && tolower(f["enabled"]) != "no" && f["uris"] != "") {
			nu = split(f["uris"], u, " "); ns = split(f["suites"], s, " ")
			opt = (f["signed-by"] ~ /^\//) ? "[signed-by=" f["signed-by"] "] " : ""
			for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
				print "deb " opt u[i] " " s[j] " " f["components"]
		}
		delete f
	}
	/^#/ { next }
	/^[ \t]*$/ { flush(); next }
	/^[ \t]/ { if (key != "") f[key] = f[key] " " $0; next }
	{ key = tolower(substr($0, 1, index($0, ":") - 1)); v = substr($0, index($0, ":") + 1); sub(/^[ \t]+/, "", v); f[key] = v }
	END { flush() }' | sed -e 's/[[:space:]]\+/ /g' -e 's/ $//'
}

# The release's own suites (bookworm, bookworm-updates, bookworm-security),
# not third-party ones.
mapfile -t mirrors < <(apt_sources | awk -v r="$release" '
	{ line = $0; sub(/\[[^]]*\]/, ""); if ($3 == r || index($3, r "-") == 1) print line }' | awk '!seen[$0]++')
((${#mirrors[@]})) || die "apt has no source for $release (/etc/apt/sources.list, /etc/apt/sources.list.d/*.sources)"
log "sources: $(printf '%s; ' "${mirrors[@]}")"

# --- the userland ---------------------------------------------------------------

# customize_root adds to the userland at $1 what the host does not have, the
# session user and the fstab.
customize_root() {
	local root=$1
	# Every path below is under $root: never let an empty one reach the host.
	# shellcheck disable=SC2015 # die unless all hold
	[ -n "$root" ] && [ "$root" != / ] && [ -x "$root/bin/sh" ] || die "customize_root: bad root '$root'"
	printf '%s\n' "$marker_text" >"$root/etc/cowork-bundle-marker"
	cat >"$root/usr/local/bin/cowork-bundle-tool" <<EOF
#!/bin/sh
# Proves a session runs the bundle's userland: the host has neither this
# tool nor its marker.
echo '$tool_text'
cat /etc/cowork-bundle-marker
EOF
	chmod 0755 "$root/usr/local/bin/cowork-bundle-tool"
	printf 'MARKER = %s\n' "'$marker_text'" >"$root/usr/lib/python3/dist-packages/cowork_bundle.py"
	chroot "$root" useradd --create-home --uid 1000 --user-group --shell /bin/bash \
		--comment 'stand-in bundle user' "$session_user"
	mkdir -p "$root$data_mount" "$root/boot/efi"
	# As the client's image: root by label, the ESP (a partition of the same
	# disk, which our guest does not mount), then the data image.
	cat >"$root/etc/fstab" <<EOF
LABEL=$root_label	/	ext4	discard,errors=remount-ro	0 1
LABEL=$esp_label	/boot/efi	vfat	umask=0077	0 1
LABEL=$data_label	$data_mount	ext4	defaults,nofail	0 2
EOF
	# The image's own network names, not the host's (mmdebstrap copies the
	# host's resolv.conf in).
	echo "$hostname" >"$root/etc/hostname"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$hostname" >"$root/etc/hosts"
	echo "# The stand-in bundle names no DNS server (the host's is not copied in)." >"$root/etc/resolv.conf"
	rm -f "$root/var/cache/apt/"*.bin "$root/var/log/"*.log
}

# --- the images -------------------------------------------------------------------

# make_ext4 FILE MIB LABEL DIR makes FILE an ext4 filesystem of MIB MiB
# labelled LABEL holding DIR's tree.
make_ext4() {
	rm -f "$1"
	truncate -s "${2}M" "$1"
	mkfs.ext4 -q -F -L "$3" -d "$4" "$1"
}

# make_disk FILE ROOTFS ESP writes the GPT disk: 14 and 15 first on disk,
# as in Ubuntu's cloud images, then partition 1 up to the backup GPT.
make_disk() {
	local disk=$1 rootfs=$2 esp=$3
	local bios_start=1 esp_start=$((1 + bios_mib)) root_start=$((1 + bios_mib + esp_mib))
	rm -f "$disk"
	truncate -s "$((root_start + root_mib + 1))M" "$disk"
	# "<disk>N :" names partition N in sfdisk's script format.
	sfdisk --quiet --no-reread --no-tell-kernel "$disk" <<EOF
label: gpt
unit: sectors
${disk}1 : start=$((root_start * 2048)), size=$((root_mib * 2048)), type=0FC63DAF-8483-4772-8E79-3D69D8477DE4
${disk}14 : start=$((bios_start * 2048)), size=$((bios_mib * 2048)), type=21686148-6449-6E6F-744E-656564454649
${disk}15 : start=$((esp_start * 2048)), size=$((esp_mib * 2048)), type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B
EOF
	dd if="$rootfs" of="$disk" bs=1M seek="$root_start" conv=notrunc,sparse status=none
	[ -z "$esp" ] || dd if="$esp" of="$disk" bs=1M seek="$esp_start" conv=notrunc,sparse status=none
}

# --- build ----------------------------------------------------------------------
mkdir -p "$BUNDLE_CACHE"
exec 9>"$BUNDLE_CACHE/.lock"
flock 9
if [ -z "${FORCE:-}" ] && [ -f "$out/bundle.txt" ]; then
	log "up to date (built meanwhile)"
	publish
	exit 0
fi

tmp="$out.tmp.$$"
# --one-file-system: should mmdebstrap die with /proc or /dev mounted in
# the chroot, the clean-up must not follow them onto the host's.
trap 'rm -rf --one-file-system "$tmp"' EXIT
rm -rf --one-file-system "$tmp"
mkdir -p "$tmp"
start=$(date +%s)

log "mmdebstrap $release minbase + ${packages[*]} (a few minutes)"
mmdebstrap --mode=root --variant=minbase --quiet \
	--include="$(
		IFS=,
		echo "${packages[*]}"
	)" \
	"$release" "$tmp/root" "${mirrors[@]}"
log "userland installed in $(($(date +%s) - start)) s"
customize_root "$tmp/root"

mkdir -p "$tmp/data"
printf '%s\n' "$data_marker_text" >"$tmp/data/cowork-data-marker"
make_ext4 "$tmp/data.img" "$data_mib" "$data_label" "$tmp/data"
make_ext4 "$tmp/root.ext4" "$root_mib" "$root_label" "$tmp/root"
esp=
if command -v mkfs.vfat >/dev/null; then
	esp="$tmp/esp.vfat"
	truncate -s "${esp_mib}M" "$esp"
	mkfs.vfat -n "$esp_label" "$esp" >/dev/null
fi
make_disk "$tmp/rootfs.img" "$tmp/root.ext4" "$esp"

{
	echo "hash=$hash"
	echo "release=$release"
	echo "packages=${packages[*]}"
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - start)) s"
	# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
	chroot "$tmp/root" dpkg-query -W -f='version ${Package}=${Version}\n' "${packages[@]}"
} >"$tmp/bundle.txt"
rm -rf --one-file-system "$tmp/root" "$tmp/data" "$tmp/root.ext4" "$tmp/esp.vfat"
[ -z "${BUNDLE_OWNER:-}" ] || chown -R "$BUNDLE_OWNER" "$tmp"
rm -rf "$out"
mv "$tmp" "$out"
log "built $out in $(($(date +%s) - start)) s: rootfs.img $(du -h --apparent-size "$out/rootfs.img" | cut -f1) ($(du -h "$out/rootfs.img" | cut -f1) on disk)"
publish
if [ -n "${BUNDLE_OWNER:-}" ]; then
	chown -h "$BUNDLE_OWNER" "$current"
	[ -z "$outdir" ] || chown -R "$BUNDLE_OWNER" "$outdir"
fi
