#!/usr/bin/env bash
# Build a cowork-vmm kernel from Debian's linux-source-6.1.
#
#   guest/kernel/build.sh guest   # the kernel our VMM boots (guest.fragment + guest-only.fragment)
#   guest/kernel/build.sh outer   # the nested-test outer kernel (guest + outer-kvm)
#   guest/kernel/build.sh guest-arm64   # the arm64 guest (guest + guest-only + arm64 + guest-only-arm64)
#   guest/kernel/build.sh outer-arm64   # the arm64 outer (guest + outer-kvm + arm64 + outer-kvm-arm64)
#   guest/kernel/build.sh outer-16k-arm64   # the same with 16 KiB pages (+ outer-16k-arm64)
#
# Output: $KERNEL_CACHE/<flavour>-<hash>/{vmlinux,bzImage,config} (x86) or
# {Image,vmlinux,config} (arm64, cross-built with aarch64-linux-gnu- unless
# the host is aarch64), and the symlink $KERNEL_CACHE/<flavour>-current pointing at it. <hash> is the sha256
# of the fragments, the source package version and this script's version, so a
# rebuild happens only when one of them changes. Each flavour has its own
# source tree ($KERNEL_CACHE/src-<flavour>): an in-tree build blocks O=.
#
# Environment: KERNEL_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/cowork-vmm/kernels),
# JOBS (default nproc), KERNEL_SOURCE_TAR (default /usr/src/linux-source-6.1.tar.xz),
# FORCE=1 rebuilds even when the output exists.
#
# A fragment may carry lines "# allow-drop: CONFIG_FOO" naming options that
# Kconfig is allowed to drop (dependency not met on this arch); any other
# fragment option that does not end up in .config fails the build.
set -euo pipefail

# Bump when a change to this script changes the built kernel.
SCRIPT_VERSION=1

flavour=${1:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# arch: the kernel's ARCH; image: the file the build is for (the cache's
# "built" marker, and what the script prints).
arch=x86
image=vmlinux
case "$flavour" in
guest) fragments=("$here/guest.fragment" "$here/guest-only.fragment") ;;
outer) fragments=("$here/guest.fragment" "$here/outer-kvm.fragment") ;;
guest-arm64) fragments=("$here/guest.fragment" "$here/guest-only.fragment" "$here/arm64.fragment" "$here/guest-only-arm64.fragment") ;;
outer-arm64) fragments=("$here/guest.fragment" "$here/outer-kvm.fragment" "$here/arm64.fragment" "$here/outer-kvm-arm64.fragment") ;;
outer-16k-arm64) fragments=("$here/guest.fragment" "$here/outer-kvm.fragment" "$here/arm64.fragment" "$here/outer-kvm-arm64.fragment" "$here/outer-16k-arm64.fragment") ;;
*)
	echo "usage: $0 guest|outer|guest-arm64|outer-arm64|outer-16k-arm64" >&2
	exit 2
	;;
esac

KERNEL_CACHE=${KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cowork-vmm/kernels}
KERNEL_SOURCE_TAR=${KERNEL_SOURCE_TAR:-/usr/src/linux-source-6.1.tar.xz}
JOBS=${JOBS:-$(nproc)}
source_pkg=linux-source-6.1
build_deps=(linux-source-6.1 bc flex bison libelf-dev libssl-dev cpio make gcc xz-utils)
if [[ $flavour == *-arm64 ]]; then
	arch=arm64
	image=Image
	export ARCH=arm64
	# The kernel's own make picks these up from the environment.
	if [ "$(uname -m)" != aarch64 ]; then
		export CROSS_COMPILE=aarch64-linux-gnu-
		build_deps+=(gcc-aarch64-linux-gnu)
	fi
fi

log() { echo "build.sh[$flavour]: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# --- dependencies ---------------------------------------------------------
missing=()
for pkg in "${build_deps[@]}"; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		log "installing ${missing[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
	else
		die "missing packages: ${missing[*]}; install them with:
  sudo apt-get update && sudo apt-get install -y ${missing[*]}"
	fi
fi
[ -f "$KERNEL_SOURCE_TAR" ] || die "$KERNEL_SOURCE_TAR not found (apt-get install -y $source_pkg)"
source_version=$(dpkg-query -W -f='${Version}' "$source_pkg" 2>/dev/null || echo unknown)

# --- cache key --------------------------------------------------------------
hash=$(
	{
		echo "script=$SCRIPT_VERSION source=$source_version flavour=$flavour"
		for f in "${fragments[@]}"; do
			echo "== $(basename "$f")"
			cat "$f"
		done
	} | sha256sum | cut -c1-16
)
out="$KERNEL_CACHE/$flavour-$hash"
current="$KERNEL_CACHE/$flavour-current"
mkdir -p "$KERNEL_CACHE"

if [ -z "${FORCE:-}" ] && [ -f "$out/$image" ]; then
	ln -sfn "$(basename "$out")" "$current"
	log "up to date"
	echo "$out/$image"
	exit 0
fi

# One build per flavour at a time; another may have just finished ours.
exec 9>"$KERNEL_CACHE/.lock-$flavour"
flock 9
if [ -z "${FORCE:-}" ] && [ -f "$out/$image" ]; then
	ln -sfn "$(basename "$out")" "$current"
	log "up to date (built meanwhile)"
	echo "$out/$image"
	exit 0
fi

# --- source tree ------------------------------------------------------------
src_root="$KERNEL_CACHE/src-$flavour"
src="$src_root/linux-source-6.1"
stamp="$src_root/.extracted"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$source_version" ]; then
	log "extracting $KERNEL_SOURCE_TAR into $src_root"
	rm -rf "$src_root"
	mkdir -p "$src_root"
	tar -xJf "$KERNEL_SOURCE_TAR" -C "$src_root"
	[ -d "$src" ] || die "expected $src after extracting $KERNEL_SOURCE_TAR"
	echo "$source_version" >"$stamp"
fi

# --- configure ----------------------------------------------------------------
cd "$src"
log "configuring (tinyconfig + ${fragments[*]##*/})"
make -s tinyconfig >/dev/null
scripts/kconfig/merge_config.sh -m .config "${fragments[@]}" >/dev/null
make -s olddefconfig >/dev/null

# Every option a fragment sets must have stuck (the last fragment wins).
declare -A want=()
declare -A allowed_drop=()
for f in "${fragments[@]}"; do
	while IFS= read -r line; do
		case "$line" in
		"# allow-drop: "*)
			for opt in ${line#"# allow-drop: "}; do allowed_drop[$opt]=1; done
			;;
		CONFIG_*=*) want[${line%%=*}]=$line ;;
		"# CONFIG_"*" is not set")
			opt=${line#"# "}
			opt=${opt%" is not set"}
			want[$opt]="# $opt is not set"
			;;
		esac
	done <"$f"
done
failed=()
for opt in "${!want[@]}"; do
	line=${want[$opt]}
	if [[ $line == "# "* ]]; then
		grep -q "^$opt=" .config && failed+=("$opt (wanted unset, got $(grep "^$opt=" .config))")
		continue
	fi
	grep -qxF "$line" .config && continue
	[ -n "${allowed_drop[$opt]:-}" ] && {
		log "note: $opt dropped (allowed)"
		continue
	}
	got=$(grep -E "^$opt=|^# $opt is not set" .config || echo "absent")
	failed+=("$line (got: $got)")
done
if ((${#failed[@]})); then
	printf '  %s\n' "${failed[@]}" >&2
	die "${#failed[@]} fragment option(s) did not stick in .config; fix their dependencies in the fragment"
fi

# --- build --------------------------------------------------------------------
targets=(vmlinux bzImage)
[ "$arch" = x86 ] || targets=(Image) # Image is objcopy'd from vmlinux
log "make -j$JOBS ${targets[*]} (several minutes)"
start=$(date +%s)
# A line every PROGRESS_SECONDS (default 30; 0: none) while make runs
# silently, so a first `make run` does not look hung.
progress=${PROGRESS_SECONDS:-30}
ticker=
if [ "$progress" -gt 0 ]; then
	(exec 9>&-; while sleep "$progress"; do
		log "still building: $(($(date +%s) - start)) s, $(find . -name '*.o' | wc -l) object files so far"
	done) &
	ticker=$!
	trap 'kill "$ticker" 2>/dev/null || true' EXIT
fi
make -s -j"$JOBS" "${targets[@]}"
[ -z "$ticker" ] || kill "$ticker" 2>/dev/null || true
log "built in $(($(date +%s) - start)) s"

tmp="$out.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
cp vmlinux "$tmp/vmlinux"
if [ "$arch" = x86 ]; then
	cp arch/x86/boot/bzImage "$tmp/bzImage"
else
	cp arch/arm64/boot/Image "$tmp/Image"
fi
cp .config "$tmp/config"
rm -rf "$out"
mv "$tmp" "$out"
ln -sfn "$(basename "$out")" "$current"
log "done: $out"
echo "$out/$image"
