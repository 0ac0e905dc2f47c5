#!/bin/sh
# install-client-helper.sh — make Claude Desktop start cowork-vmm as its
# Cowork helper, keeping the official helper as a backup, and put it back.
#
#   sudo scripts/install-client-helper.sh install [BINARY]   # default: bin/cowork-vmm beside this script's repo, else cowork-vmm on PATH
#   sudo scripts/install-client-helper.sh restore            # put the official helper back
#   scripts/install-client-helper.sh status
#
# Options (before the command): --helper PATH  the client's helper
# (default /usr/lib/claude-desktop/resources/cowork-linux-helper, or
# $CLAUDE_HELPER), --dry-run  say what would be done.
#
# The client derives the helper's path from its resources directory; no
# setting points it elsewhere, so the binary is replaced in place. A client
# update overwrites it again: re-run `install` after every update (it then
# keeps the new official helper as the backup). Files change only by rename
# within the helper's directory, so a half-done run leaves either the old or
# the new binary, never a partial one.
set -eu

BACKUP_SUFFIX=.cowork-vmm-backup
MODULE=github.com/cowork-vmm/cowork-vmm
helper=${CLAUDE_HELPER:-/usr/lib/claude-desktop/resources/cowork-linux-helper}
dry=

say() { printf '%s\n' "$*"; }
die() { printf 'install-client-helper: %s\n' "$*" >&2; exit 1; }
run() {
	if [ -n "$dry" ]; then say "would run: $*"; else "$@"; fi
}

usage() {
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
	exit "${1:-0}"
}

# is_ours FILE: FILE is a cowork-vmm build (its Go build info names our
# module). Never runs FILE.
is_ours() {
	[ -f "$1" ] && grep -aq "$MODULE" "$1"
}

while [ $# -gt 0 ]; do
	case $1 in
	--helper) [ $# -ge 2 ] || die "--helper needs a path"; helper=$2; shift 2 ;;
	--helper=*) helper=${1#--helper=}; shift ;;
	--dry-run) dry=1; shift ;;
	-h|--help|help) usage 0 ;;
	--) shift; break ;;
	-*) die "unknown option $1 (see --help)" ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || usage 2
cmd=$1; shift
backup=$helper$BACKUP_SUFFIX
dir=$(dirname -- "$helper")

need_writable() {
	[ -d "$dir" ] || die "$dir does not exist: is Claude Desktop installed? (use --helper PATH for another packaging)"
	[ -n "$dry" ] || [ -w "$dir" ] || die "cannot write $dir: run with sudo"
}

case $cmd in
status)
	if [ ! -e "$helper" ]; then
		say "no helper at $helper (Claude Desktop not installed here? use --helper PATH)"
	elif is_ours "$helper"; then
		say "$helper is cowork-vmm: Claude Desktop starts cowork-vmm"
	else
		say "$helper is not cowork-vmm: Claude Desktop starts the official helper"
	fi
	if [ -e "$backup" ]; then say "backup of the official helper: $backup"; else say "no backup at $backup"; fi
	;;

install)
	src=${1:-}
	if [ -z "$src" ]; then
		here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
		if [ -x "$here/../bin/cowork-vmm" ]; then
			src=$here/../bin/cowork-vmm
		else
			src=$(command -v cowork-vmm || true)
		fi
	fi
	[ -n "$src" ] && [ -f "$src" ] && [ -x "$src" ] || die "no cowork-vmm binary to install (build it with \`make build\`, or name it: install PATH)"
	is_ours "$src" || die "$src is not a cowork-vmm build"
	"$src" version >/dev/null 2>&1 || die "$src does not run (\`$src version\` failed): it must be a static build (make build)"
	need_writable
	[ -e "$helper" ] || die "no helper at $helper: is Claude Desktop installed? (use --helper PATH for another packaging)"
	if is_ours "$helper"; then
		if [ ! -e "$backup" ]; then
			say "warning: $helper is already cowork-vmm and there is no backup of the official helper; \`restore\` will not be possible (reinstall Claude Desktop to get it back)" >&2
		fi
	else
		# The official helper: keep it (a newer one after a client update
		# replaces an older backup).
		if [ -e "$backup" ]; then
			say "the client was updated since the last install: keeping its new official helper as the backup"
		fi
		run cp -p -- "$helper" "$backup.tmp.$$"
		run mv -f -- "$backup.tmp.$$" "$backup"
		say "kept the official helper as $backup"
	fi
	run cp -- "$src" "$helper.tmp.$$"
	run chmod 0755 "$helper.tmp.$$"
	run mv -f -- "$helper.tmp.$$" "$helper"
	say "installed $src as $helper"
	say "quit Claude Desktop completely and start it again; check with: cowork-vmm doctor"
	say "re-run this after every Claude Desktop update (an update puts the official helper back)"
	;;

restore)
	need_writable
	[ -e "$backup" ] || die "no backup at $backup: nothing to restore (reinstalling Claude Desktop also restores its helper)"
	if [ -e "$helper" ] && ! is_ours "$helper"; then
		die "$helper is not cowork-vmm (a client update already put an official helper back); leaving it. Remove the stale $backup yourself if you like"
	fi
	run mv -f -- "$backup" "$helper"
	say "restored the official helper at $helper; restart Claude Desktop"
	;;

*)
	die "unknown command $cmd (install, restore or status)"
	;;
esac
