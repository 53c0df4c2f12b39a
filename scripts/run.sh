#!/usr/bin/env bash
# Sets up, builds and trains the embedded default (configs/tiny.yaml) on the CPU.
# Extra arguments go to `keel train`, e.g. scripts/run.sh --set run.max_steps=100
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$("$root/scripts/build.sh" --target keel)"
cd "$root"
exec "$build/keel" train configs/tiny.yaml "$@"
