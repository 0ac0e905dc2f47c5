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
		# -fuzzminimizetime 0: no minimising of new corpus entries, which
		# can otherwise outlive -fuzztime and fail the run with "context
		# deadline exceeded" (a crash still stops the run and is saved).
		for attempt in 1 2; do
			if "$go" test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 0 "./$dir" >/tmp/fuzz-$$.log 2>&1; then
				break
			fi
			# The go command's own deadline race (no failing input saved):
			# try once more; a real crash writes "Failing input written".
			if [ "$attempt" = 1 ] && grep -q "context deadline exceeded" /tmp/fuzz-$$.log &&
				! grep -q "Failing input written" /tmp/fuzz-$$.log; then
				echo "fuzz: ./$dir $target: the go command's deadline race, once more"
				continue
			fi
			cat /tmp/fuzz-$$.log
			status=1
			break
		done
	done
done < <(git ls-files '*_test.go' 2>/dev/null | xargs grep -l '^func Fuzz' | sort)
rm -f /tmp/fuzz-$$.log
exit $status
