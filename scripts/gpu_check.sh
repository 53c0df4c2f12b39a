#!/usr/bin/env bash
# Throughput check on a machine with a CUDA GPU (never run in CI; there is no GPU there): builds
# keel, then trains a 124M (gpt2-small dimensions) and a 350M (gpt2-medium dimensions) llama-style
# model in bf16 with keel and with the plain PyTorch reference (bench/reference/train_ref.py),
# alternately, and prints a Markdown table of median tokens/s, the keel/reference ratio and MFU
# against this GPU's bf16 matmul peak (8192³, measured in the same run with the same torch).
# A few minutes on an H100-class GPU once keel is built. Extra arguments go to bench/run.py, e.g.
#   scripts/gpu_check.sh --pairs 3 --json gpu.json
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2
build="$("$root/scripts/build.sh" --target keel)"
# keel logs every 5 steps rather than every step: a log step also snapshots all weights for the
# update ratios and reads several values back to the host, work a real run does not do per step
# (the per-config warm-up and step counts are multiples of 5). One checkpoint kept of each kind:
# keel's free-space check asks for room for keep_last + stable.keep + 1 checkpoints (4.3 GB each at
# 350M), and only the start and end saves are ever written here.
KEEL="$build/keel" exec "$root/bench/run.sh" --device cuda --precision bf16 --configs 124m 350m \
  --pairs 2 --log-every 5 --keel-set checkpoint.keep_last=1 --keel-set checkpoint.stable.keep=1 "$@"
