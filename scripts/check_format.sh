#!/usr/bin/env bash
# Fails when a C++ file under src/, tests/ or bench/ differs from clang-format's output
# (.clang-format at the root; Debian bookworm's clang-format 14, installed by setup.sh).
# Fix with: scripts/check_format.sh --fix. With file arguments it checks just those files.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
clang_format="${CLANG_FORMAT:-clang-format}"
command -v "$clang_format" >/dev/null || { echo "check_format: $clang_format not found (scripts/setup.sh installs it)" >&2; exit 2; }
fix=0
[ "${1:-}" = "--fix" ] && { fix=1; shift; }
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files -co --exclude-standard -- 'src/*.cpp' 'src/*.h' 'tests/*.cpp' \
                      'tests/*.h' 'bench/*.cpp' 'bench/*.h' | grep -v '^third_party/' || true)
fi
[ ${#files[@]} -gt 0 ] || { echo "check_format: no C++ files found" >&2; exit 2; }
if [ $fix = 1 ]; then
  "$clang_format" -i "${files[@]}"
  exit 0
fi
if ! "$clang_format" --dry-run -Werror "${files[@]}"; then
  echo "check_format: the files above are not clang-formatted; run scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
