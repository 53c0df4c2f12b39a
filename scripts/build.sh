#!/usr/bin/env bash
# Sets up (idempotent) and builds keel into build/ (override with KEEL_BUILD_DIR).
# Uses Ninja and ccache when present; a precompiled header covers LibTorch's headers.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${KEEL_BUILD_DIR:-$root/build}"
torch_prefix="$("$root/scripts/setup.sh" | tail -n 1)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$torch_prefix" \
        -DCMAKE_BUILD_TYPE="${KEEL_BUILD_TYPE:-RelWithDebInfo}" >&2
fi
cmake --build "$build" --parallel "${KEEL_JOBS:-$(nproc)}" "$@" >&2
echo "$build"
