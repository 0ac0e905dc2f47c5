#!/usr/bin/env bash
# boot-ledger.sh LEDGER: prints how many Linux-boot tests ran during
# `make test` (LEDGER is the file COWORK_VMM_BOOT_LEDGER named: one line per
# test that booted Linux, "direct|nested|nested-arm64[-gicv2] <package dir>
# <test>": nested-arm64 is the arm64 harness, counted apart, -gicv2 with a
# GICv2 in its outer guest), and fails
# when none did on a machine that could run them: qemu for the nested
# harness, and both kernels built.
set -euo pipefail
ledger="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cowork-vmm/kernels}"
total=$(grep -c . "$ledger" || true)
direct=$(grep -c '^direct' "$ledger" || true)
nested=$(grep -c $'^nested\t' "$ledger" || true)
nested_arm64=$(grep -c '^nested-arm64' "$ledger" || true)
gicv2=$(grep -c $'^nested-arm64-gicv2\t' "$ledger" || true)
echo "ci: Linux-boot tests that ran: $total (directly: $direct, in the nested harness: $nested, in the arm64 nested harness: $nested_arm64, $gicv2 of them with a GICv2)"
while IFS=$'\t' read -r mode dir test; do
	echo "ci:   $mode ${dir#"$root"/} $test"
done < "$ledger"
if [ "$total" -eq 0 ] && command -v qemu-system-x86_64 >/dev/null &&
	[ -f "$cache/guest-current/vmlinux" ] && [ -f "$cache/outer-current/vmlinux" ]; then
	echo "ci: no Linux-boot test ran although qemu and both kernels are here: the VM is untested" >&2
	exit 1
fi
