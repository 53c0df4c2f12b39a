#!/usr/bin/env bash
# Loader throughput at a training shape (B=16, T=1024) on the prepared Debian fortunes corpus,
# against the tokens/s a trainer consumes (pass keel's measured figures as extra arguments).
#   bench/data/loader_bench.sh BUILD_DIR [--consumes TOKENS_PER_S]...
set -euo pipefail
BUILD=${1:?usage: loader_bench.sh BUILD_DIR [--consumes TOKENS_PER_S]...}
shift
cmake --build "$BUILD" --target keel_bench_loader >&2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$BUILD/keel" prepare --input /usr/share/games/fortunes --output "$OUT/data" --separator % \
    --cluster source --seq-len 1024 > /dev/null
"$BUILD/bench/data/keel_bench_loader" "$OUT/data" --batch 16 --seq 1024 "$@"
