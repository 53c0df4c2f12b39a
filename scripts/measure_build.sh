#!/usr/bin/env bash
# Measures keel's build loop (issue 45), as CI and a developer meet it, and prints the rows of
# docs/benchmarks.md's "Build and test" table:
#   1. cold:   a fresh clone of COMMIT built from nothing (ccache not read: CCACHE_RECACHE, which
#              still stores the objects for step 5), the keel target first (scripts/run.sh's
#              build), then every target; then scripts/run.sh's training of configs/tiny.yaml;
#   2. schema: that build again after an edit of src/config/schema.h (a new declaration, so every
#              includer really recompiles; ccache cannot serve it);
#   3. guard:  the same for src/guard/guard.h;
#   4. touch:  `touch` of each header (contents unchanged: ccache serves the objects);
#   5. warm:   a second fresh clone in another folder, built with the cache steps 1-4 filled, as CI
#              builds on the machine a session used;
#   6. suite:  with --suite, the test suite at -j2 in that clone (scripts/test.sh's ctest line).
# Compile seconds are the sum of ninja's per-unit times (build/.ninja_log: end - start of every
# object and precompiled header), wall seconds the build command's. Usage:
#   scripts/measure_build.sh [--suite] [--keep] [COMMIT]      (default HEAD; run from the checkout)
# It uses both cores: run nothing else meanwhile. Work folders go under ${TMPDIR:-/tmp}.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
suite=0 keep=0 commit=HEAD
for a in "$@"; do
  case "$a" in
    --suite) suite=1 ;;
    --keep) keep=1 ;;
    -*) echo "measure_build: unknown option $a (valid: --suite, --keep)" >&2; exit 2 ;;
    *) commit="$a" ;;
  esac
done
sha="$(git -C "$root" rev-parse --short "$commit")"
work="$(mktemp -d "${TMPDIR:-/tmp}/keel-measure.XXXXXX")"
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
"$root/scripts/setup.sh" >/dev/null

clone() {  # clone DIR: a fresh checkout of COMMIT, as CI makes one
  git clone -q --no-local "$root" "$1"
  git -C "$1" checkout -q "$sha"
}
compile_seconds() {  # compile_seconds BUILD_DIR [BEFORE]: summed unit times in ninja's log, of the
  # lines not in the copy BEFORE of the log (ninja may rewrite the log, so lines, not offsets)
  awk -v before="${2:-}" '
    BEGIN { if (before != "") while ((getline line < before) > 0) seen[line] = 1 }
    FNR > 1 && !($0 in seen) && ($4 ~ /\.o$/ || $4 ~ /\.gch$/) { s += ($2 - $1) / 1000; n++ }
    END { printf "%.0f %d\n", s, n }' "$1/.ninja_log"
}
build() {  # build CHECKOUT [ARGS]: wall seconds of scripts/build.sh (every target, or ARGS')
  local t0 t1 checkout="$1"
  shift
  t0=$(date +%s.%N)
  KEEL_BUILD_DIR="$checkout/build" "$checkout/scripts/build.sh" "$@" >/dev/null 2>"$work/build.log" ||
    { tail -n 30 "$work/build.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t0 $t1" | awk '{ printf "%.0f", $2 - $1 }'
}
hits() {  # the share of cacheable compiler calls ccache served since the last `ccache -z`
  ccache --print-stats 2>/dev/null | awk '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { h += $2 }
    $1 == "cache_miss" { m += $2 }
    END { if (h + m) printf "%d of %d calls (%.0f %%)", h, h + m, 100 * h / (h + m); else print "no calls" }'
}
row() { printf '| %s | %s | %s | %s |\n' "$@"; }

have_ccache=0
command -v ccache >/dev/null && have_ccache=1
echo "# keel build loop at $sha on $(nproc) cores ($(date -u +%Y-%m-%d))"
row "step" "wall s" "compile s (units)" "ccache"
row "---" "---" "---" "---"

a="$work/a"
clone "$a"
[ "$have_ccache" = 1 ] && ccache -z >/dev/null
keel_wall=$(CCACHE_RECACHE=1 build "$a" --target keel)
keel_units="$(compile_seconds "$a/build")"
row "cold: the keel target (scripts/run.sh's build)" "$keel_wall" "$(echo "$keel_units" | awk '{print $1" ("$2")"}')" "not read"
rest_wall=$(CCACHE_RECACHE=1 build "$a")
row "cold: every target from nothing" "$((keel_wall + rest_wall))" "$(compile_seconds "$a/build" | awk '{print $1" ("$2")"}')" "not read"
t0=$(date +%s)
(cd "$a" && build/keel train configs/tiny.yaml --set logging.progress=off --run-dir "$work/tiny" >/dev/null 2>&1)
row "scripts/run.sh's training (configs/tiny.yaml)" "$(($(date +%s) - t0))" "" ""

for header in src/config/schema.h src/guard/guard.h; do
  cp "$a/build/.ninja_log" "$work/log.before"
  echo "inline constexpr int kMeasureBuildEdit$RANDOM = 1;" >> "$a/$header"
  [ "$have_ccache" = 1 ] && ccache -z >/dev/null
  wall=$(build "$a")
  row "edit $header" "$wall" "$(compile_seconds "$a/build" "$work/log.before" | awk '{print $1" ("$2")"}')" "$(hits)"
  git -C "$a" checkout -q -- "$header"
  build "$a" >/dev/null  # back to the committed header: a rebuild the cache serves, not counted
done
for header in src/config/schema.h src/guard/guard.h; do
  cp "$a/build/.ninja_log" "$work/log.before"
  touch "$a/$header"
  [ "$have_ccache" = 1 ] && ccache -z >/dev/null
  wall=$(build "$a")
  row "touch $header" "$wall" "$(compile_seconds "$a/build" "$work/log.before" | awk '{print $1" ("$2")"}')" "$(hits)"
done

b="$work/elsewhere/b"
mkdir -p "$(dirname "$b")"
clone "$b"
[ "$have_ccache" = 1 ] && ccache -z >/dev/null
wall=$(build "$b")
row "second clone, warm cache" "$wall" "$(compile_seconds "$b/build" | awk '{print $1" ("$2")"}')" "$(hits)"

if [ "$suite" = 1 ]; then
  t0=$(date +%s)
  (cd "$b/build" && ./keel --version >/dev/null &&
   ctest --timeout 900 -j 2 -LE gpu > "$work/suite.log" 2>&1) || true
  t1=$(date +%s)
  summary="$(grep -E 'tests passed|tests failed' "$work/suite.log" | tail -n 1)"
  row "suite at -j2 (ctest -LE gpu)" "$((t1 - t0))" "$summary" ""
  grep -E '^ *[0-9]+/[0-9]+ Test' "$work/suite.log" |
    sed -E 's/.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/' | sort -rn | head -n 20 \
    > "$work/slowest.txt"
  echo; echo "slowest 20 (s, test):"; cat "$work/slowest.txt"
  cp "$work/suite.log" "${TMPDIR:-/tmp}/keel-measure-suite-$sha.log"
fi
