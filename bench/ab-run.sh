#!/bin/sh
# ab-run.sh BASE [ROUNDS]: the in-process Run benchmark (the engine's
# BenchmarkRunInProcess, in internal/engine since issue 23, in reactor before: a 3-step reactor from 64 goroutines, NoWait, on a
# redis-server of its own) of this checkout against commit BASE, old and
# new alternating so that machine noise hits both. Prints one line per
# round and side: runs/s, CPU per run (this process and Redis), round trips
# and Redis commands per run. Build outputs go to a temporary directory.
set -eu
base=${1:?usage: bench/ab-run.sh BASE [ROUNDS]}
rounds=${2:-5}
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$root" worktree add --detach "$tmp/base" "$base" >/dev/null 2>&1
# The benchmark's package: internal/engine, or reactor in a build from
# before the engine core moved.
pkg() { if [ -f "$1/internal/engine/run_bench_test.go" ]; then echo ./internal/engine/; else echo ./reactor/; fi; }
(cd "$tmp/base" && go test -c -o "$tmp/base.test" "$(pkg "$tmp/base")")
(cd "$root" && go test -c -o "$tmp/new.test" "$(pkg "$root")")
cd "$root"
i=1
while [ "$i" -le "$rounds" ]; do
	for side in base new; do
		printf '%s %-4s ' "$i" "$side"
		"$tmp/$side.test" -test.run '^$' -test.bench RunInProcess -test.benchtime 3s -test.benchmem 2>&1 |
			grep '^BenchmarkRunInProcess' |
			grep -o '[0-9.]* \(runs/s\|go-us/run\|redis-us/run\|rts/run\|cmds/run\|allocs/op\)' | tr '\n' ' '
		echo
	done
	i=$((i + 1))
done
