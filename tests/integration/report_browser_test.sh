#!/usr/bin/env bash
# keel report, seen by a real browser: trains a short run with a broken update (an lr spike the
# guard rolls back, writing forensics), writes its report, renders it with headless Chromium, and
# checks the rendered DOM holds the plots and the incident with its forensic samples.
#
#   tests/integration/report_browser_test.sh KEEL_BINARY SCRATCH_DIR [RUN_DIR]
#
# With RUN_DIR, reports that existing run instead of training one (it is only read: the page is
# written under SCRATCH_DIR). Exit 0 pass, 1 fail, 77 skipped (no Chromium: CTest's SKIP_RETURN_CODE).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 KEEL_BINARY SCRATCH_DIR [RUN_DIR]" >&2
  exit 2
fi
browser=""
for candidate in chromium-headless-shell chromium chromium-browser google-chrome headless_shell; do
  if command -v "$candidate" >/dev/null 2>&1; then
    browser=$(command -v "$candidate")
    break
  fi
done
if [ -z "$browser" ]; then
  echo "SKIP: no headless Chromium (apt-get install chromium-headless-shell)"
  exit 77
fi
keel=$(realpath "$1")
scratch=$2
run_dir=${3:-}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

mkdir -p "$scratch"
scratch=$(realpath "$scratch")
if [ -z "$run_dir" ]; then
  # The guard's rollback scenario of tests/integration/resume_guard_test.cpp, with evals: a 100x lr
  # on step 44's update, the alarm at 45, forensics, a rollback to the stable snapshot at 40.
  run_dir=$scratch/run
  rm -rf "$run_dir"
  "$keel" train --set logging.progress=off --set logging.every_steps=1 --set eval.batches=1 \
    --set eval.every_steps=20 --set schedule.warmup_steps=2 --set run.threads=1 \
    --set model.d_model=128 --set model.seq_len=128 --set optim.lr=3e-3 --set run.max_steps=60 \
    --set checkpoint.stable.every_steps=10 --set checkpoint.stable.window=5 \
    --set stability.median_window=20 --set stability.recovery.steps=5 \
    --set stability.screen.enabled=false \
    --set 'faults=[{kind: lr_spike, factor: 100, at_step: 44, steps: 1}]' \
    --run-dir "$run_dir" >"$scratch/train.log" 2>&1 || fail "keel train failed: $(tail -5 "$scratch/train.log")"
fi
[ -f "$run_dir/metrics.jsonl" ] || fail "$run_dir holds no metrics.jsonl"

page=$scratch/report.html
out=$("$keel" report "$run_dir" -o "$page") || fail "keel report exited $?"
[ "$(echo "$out" | head -1)" = "$page" ] || fail "keel report printed '$out', not the page's path"
[ -s "$page" ] || fail "no page at $page"

# Self-contained: no scripts, stylesheets or images fetched; the only URL is SVG's namespace name.
urls=$(grep -o 'http[^"]*' "$page" | sort -u)
[ "$urls" = "http://www.w3.org/2000/svg" ] || fail "the page references: $urls"
grep -q '<script' "$page" && fail "the page holds a script"

# A private profile: the browser writes nothing under HOME, and two runs never share one.
chrome=("$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars
  --user-data-dir="$scratch/chrome-profile" "--window-size=1280,2000")
timeout 120 "${chrome[@]}" --screenshot="$scratch/report.png" "file://$page" \
  >"$scratch/chrome.log" 2>&1 || fail "screenshot failed: $(tail -3 "$scratch/chrome.log")"
timeout 120 "${chrome[@]}" --dump-dom "file://$page" >"$scratch/dom.html" \
  2>>"$scratch/chrome.log" || fail "--dump-dom failed: $(tail -3 "$scratch/chrome.log")"
[ "$(head -c 8 "$scratch/report.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] ||
  fail "$scratch/report.png is not a PNG"
[ "$(stat -c %s "$scratch/report.png")" -gt 20000 ] || fail "the screenshot is nearly empty"

dom=$scratch/dom.html
expect() {  # expect PATTERN WHAT: the rendered DOM holds PATTERN
  grep -q -- "$1" "$dom" || fail "the rendered page has no $2 ($1)"
}
for id in plot-events plot-loss plot-grad-norm plot-lr plot-data-tokens; do
  expect "<svg id=\"$id\"" "plot $id"
done
expect '<path d="M' "curve"
expect '<title>pause at step' "pause marker"
expect '<title>rollback at step' "rollback marker"
expect '<tr class="incident" id="incident-1">' "incident row"
expect '<tr class="sample">' "forensic sample row"
expect 'step_000000' "rollback target"
expect '<section id="config">' "config section"
grep -q 'id="notes"' "$dom" || fail "no notes section"

# A directory that is not a run is the user's mistake: exit 2, and a message naming it.
mkdir -p "$scratch/not-a-run"
set +e
"$keel" report "$scratch/not-a-run" -o "$scratch/none.html" 2>"$scratch/not-a-run.err"
code=$?
set -e
[ $code -eq 2 ] || fail "keel report on a non-run directory exited $code, not 2"
grep -q "not a run directory" "$scratch/not-a-run.err" || fail "no message for a non-run directory"

echo "PASS: $page rendered by $(basename "$browser") ($(grep -c '<svg id="plot-' "$dom") plots)"
