#!/usr/bin/env bash
# Prepare throughput (MB/s of input per thread) on the Debian fortunes corpus, 1 and N threads.
#   bench/data/prepare_bench.sh build/keel [N]
set -euo pipefail
KEEL=${1:?usage: prepare_bench.sh KEEL_BINARY [THREADS]}
N=${2:-2}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for t in 1 "$N"; do
  "$KEEL" prepare --input /usr/share/games/fortunes --output "$OUT/f$t" --separator % \
      --cluster source --seq-len 256 --threads "$t" > /dev/null
  python3 - "$OUT/f$t/report.json" "$t" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("threads=%s docs_in=%d exact=%d near=%d by_length=%d out=%d tokens=%d MB=%.2f s=%.2f MB/s=%.2f MB/s/thread=%.2f MB/cpu-s=%.2f"
      % (sys.argv[2], r["documents_in"], r["exact_duplicates"], r["near_duplicates"], r["removed_by_length"],
         r["documents_out"], r["tokens_out"], r["bytes_in"] / 1e6, r["seconds"], r["mb_per_s"], r["mb_per_s_per_thread"], r["mb_per_cpu_s"]))
PY
done
