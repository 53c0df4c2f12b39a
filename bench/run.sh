#!/usr/bin/env bash
# Runs bench/run.py (keel vs plain PyTorch, CPU throughput) with the torch interpreter that
# scripts/setup.sh installed, whose LibTorch keel links, so both sides run the same torch.
# Arguments go to bench/run.py, e.g. bench/run.sh --configs small medium --pairs 3 --json out.json
# Overrides: KEEL (the binary; default $KEEL_BUILD_DIR/keel or build/keel), KEEL_PYTHON.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
keel="${KEEL:-${KEEL_BUILD_DIR:-$root/build}/keel}"
torch_version="$(sed -n 's/^TORCH_VERSION="\([^"]*\)".*/\1/p' "$root/scripts/setup.sh")"
python="${KEEL_PYTHON:-${KEEL_CACHE:-$HOME/.cache/keel}/torch-$torch_version/bin/python}"
[ -x "$keel" ] || { echo "bench/run.sh: no keel binary at $keel; build it with scripts/build.sh --target keel" >&2; exit 2; }
[ -x "$python" ] || { echo "bench/run.sh: no torch interpreter at $python; run scripts/setup.sh" >&2; exit 2; }
exec "$python" "$root/bench/run.py" --keel "$keel" --python "$python" "$@"
