#!/usr/bin/env bash
# bench-compare.sh BASE [COUNT] — the translation and push benchmarks of
# commit BASE and of the working tree, on this machine in one run, as
# ratios with their spread (benchstat). Each package's test binary is
# built once per tree; the runs then alternate base, head, base, head, …
# COUNT times, so that the machine's drift over the run falls on both
# alike. `make bench-compare BASE=<commit>` calls it.
set -euo pipefail

base=${1:?usage: bench-compare.sh BASE [COUNT]}
count=${2:-6}
root=$(git rev-parse --show-toplevel)
benchstat=${BENCHSTAT:-$root/bin/tools/benchstat}
# The benchmarks a change to translation or pushing moves: discovery's
# push context and translation, and the xDS server's encodings and sends.
packages=(internal/translate services/discovery/xds)
pattern=${BENCH:-.}

work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach --quiet "$work/base" "$(git -C "$root" rev-parse --verify "$base^{commit}")"

for tree in base head; do
	dir=$root
	[ "$tree" = base ] && dir=$work/base
	for p in "${packages[@]}"; do
		if [ ! -d "$dir/$p" ]; then
			echo "bench-compare: $p does not exist at $tree" >&2
			exit 1
		fi
		(cd "$dir/$p" && go test -c -o "$work/$tree-${p//\//_}.test" .)
	done
done

for i in $(seq "$count"); do
	for tree in base head; do
		for p in "${packages[@]}"; do
			dir=$root/$p
			[ "$tree" = base ] && dir=$work/base/$p
			# testdata paths are relative to the package's directory.
			(cd "$dir" && "$work/$tree-${p//\//_}.test" -test.run '^$' -test.bench "$pattern" -test.benchmem -test.count 1) \
				| grep -E '^(goos|goarch|pkg|cpu|Benchmark)' >>"$work/$tree.txt"
		done
	done
	echo "bench-compare: run $i of $count done" >&2
done

"$benchstat" base="$work/base.txt" head="$work/head.txt"
