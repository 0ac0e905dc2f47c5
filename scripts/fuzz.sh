#!/usr/bin/env bash
# Runs every native Go fuzz target in the module for FUZZTIME each (default
# 5s): the seed corpora under testdata/fuzz already run in `go test`; this
# explores beyond them. Fails on the first target that finds a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-5s}"
go="${GO:-go}"
status=0
while IFS= read -r file; do
	dir=$(dirname "$file")
	for target in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/'); do
		echo "fuzz: ./$dir $target ($fuzztime)"
		if ! "$go" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "./$dir" >/tmp/fuzz-$$.log 2>&1; then
			cat /tmp/fuzz-$$.log
			status=1
		fi
	done
done < <(git ls-files '*_test.go' 2>/dev/null | xargs grep -l '^func Fuzz' | sort)
rm -f /tmp/fuzz-$$.log
exit $status
