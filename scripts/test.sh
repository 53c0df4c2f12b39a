#!/usr/bin/env bash
# Sets up, builds and runs every test (unit + integration) on the CPU. GPU-only tests carry the
# label `gpu` and are excluded here; run them with `ctest -L gpu` on a machine with a GPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$("$root/scripts/build.sh")"
cd "$build"
# Load LibTorch once before the clock starts: on a fresh machine its first start reads ~2.7 GB of
# shared libraries from a cold disk (30 s seen), which would otherwise land inside a timed test.
"$build/keel" --version >/dev/null
ctest --output-on-failure --timeout 900 -j "${KEEL_TEST_JOBS:-2}" -LE gpu "$@"
