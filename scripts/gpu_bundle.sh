#!/usr/bin/env bash
# Packs keel for a bare CUDA machine into one folder that travels (issue 17), and checks it here.
#
# The accelerator machine reaches no package registry; it has CUDA, CMake, ninja and a python3
# holding torch 2.11.0+cu130 (the release keel pins), and none of yaml-cpp, spdlog, fmt, xxHash,
# SentencePiece or zstd. So keel is built here and carried there:
#   - a Release keel built against the pinned CUDA-enabled wheel (keel compiles no CUDA kernels; it
#     links LibTorch's CUDA libraries), in its own build directory (default build-bundle/),
#     stripped, with an RPATH (not RUNPATH) of $ORIGIN/lib, so that lib/ also serves the
#     libraries' own needs;
#   - lib/: every shared library keel needs that is neither glibc nor LibTorch (LibTorch = whatever
#     the wheel's torch/lib and nvidia/*/lib provide, which the GPU machine's own torch provides
#     too): spdlog, fmt, yaml-cpp, xxHash, SentencePiece, zstd, zlib, and libstdc++
#     and libgcc_s (built with and tested against these; the other machine's may be older);
#   - what scripts/gpu_check.sh --bundle needs: bench/run.py, bench/reference/, configs/, and
#     scripts/gpu_check.sh itself; MANIFEST.txt records the commit, torch release and glibc floor.
# Then it checks the bundle: its size (at most 60 MiB, printed); `ldd` with LD_LIBRARY_PATH set to
# the wheel's torch/lib only must resolve every library from the bundle, glibc or LibTorch; and
# `keel --version` and a 3-step CPU run of the embedded tiny config must work in a clean environment
# (env -i). Any failure exits non-zero.
#
#   scripts/gpu_bundle.sh                  # -> bundle/; the first build takes ~40 min on 2 cores
#   scripts/gpu_bundle.sh --out DIR --build-dir DIR --jobs N
#
# Then, with the device tool: run `scripts/gpu_check.sh --bundle bundle` with carry ["bundle"]
# (docs/benchmarks.md, "GPU check").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/bundle"
build="$root/build-bundle"
jobs="${KEEL_JOBS:-$(nproc)}"
max_bytes=$((60 * 1024 * 1024))
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "[bundle] $*" >&2; }
fail() { echo "[bundle] FAILED: $*" >&2; exit 1; }

# ---- build -----------------------------------------------------------------------------------
torch_prefix="$("$root/scripts/setup.sh" | tail -n 1)"       # .../site-packages/torch/share/cmake
torch_dir="$(cd "$torch_prefix/../.." && pwd)"                # .../site-packages/torch
torch_lib="$torch_dir/lib"
torch_version="$(sed -n 's/^TORCH_VERSION="\([^"]*\)".*/\1/p' "$root/scripts/setup.sh")"
command -v ninja >/dev/null || fail "ninja is missing (scripts/setup.sh installs ninja-build)"
log "configuring $build (Release, tests off, RPATH \$ORIGIN/lib)"
# BUILD_WITH_INSTALL_RPATH: the binary gets $ORIGIN/lib and none of the build machine's paths.
# --disable-new-dtags: DT_RPATH, which (unlike DT_RUNPATH) is also searched for the needs of the
# libraries keel loads (libspdlog -> libfmt, libsentencepiece_train -> libsentencepiece, ...).
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCMAKE_BUILD_TYPE=Release -DKEEL_BUILD_TESTS=OFF -DKEEL_PARQUET=OFF \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags >"$build/configure.log" 2>&1 ||
  { tail -n 30 "$build/configure.log" >&2; fail "cmake configure (log: $build/configure.log)"; }
log "building keel with $jobs job(s)"
cmake --build "$build" --target keel --parallel "$jobs" >&2
readelf -d "$build/keel" | grep -q 'NEEDED.*\[libtorch_cuda\.so\]' ||
  fail "$build/keel does not link libtorch_cuda.so: it would not see a GPU"

# ---- classify what ldd resolves --------------------------------------------------------------
# LibTorch: every file name in the wheel's torch/lib and nvidia/*/lib (its sonames are file names).
declare -A libtorch=()
for d in "$torch_lib" "$torch_dir"/../nvidia/*/lib; do
  [ -d "$d" ] || continue
  for f in "$d"/*.so*; do libtorch["$(basename "$f")"]=1; done
done
# glibc: the C library and the libraries that ship in its package; every Linux machine has them.
is_glibc() {
  local names='libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|libanl|libnsl'
  [[ "$1" =~ ^($names|libBrokenLocale)\.so\.[0-9]+$ ||
     "$1" =~ ^ld-linux(-x86-64|-aarch64)?\.so\.[0-9]+$ || "$1" == linux-vdso.so.1 ]]
}
# Prints "soname<TAB>resolved path" for each library ldd lists ("not found" when unresolved).
ldd_list() {
  LD_LIBRARY_PATH="$torch_lib" ldd "$1" | awk '
    $2 == "=>" && $3 == "not" { print $1 "\tnot found"; next }
    $2 == "=>"                { print $1 "\t" $3; next }
    $1 ~ /^\//                { n = $1; sub(/.*\//, "", n); print n "\t" $1; next }
                              { print $1 "\t(virtual)" }'
}

# ---- assemble --------------------------------------------------------------------------------
if [ -e "$out" ]; then
  [ -f "$out/MANIFEST.txt" ] || [ -z "$(ls -A "$out")" ] ||
    fail "$out exists and is not a bundle (no MANIFEST.txt); not deleting it"
  rm -rf "$out"
fi
mkdir -p "$out/lib" "$out/bench" "$out/scripts"
strip --strip-all -o "$out/keel" "$build/keel"
declare -A source_of=()
while IFS=$'\t' read -r name path; do
  is_glibc "$name" && continue
  [ -n "${libtorch[$name]:-}" ] && continue
  [ "$path" = "not found" ] && fail "ldd finds no $name for $build/keel"
  cp -L "$path" "$out/lib/$name"
  source_of["$name"]="$path"
  chmod u+w "$out/lib/$name"
  strip --strip-unneeded "$out/lib/$name"
done < <(ldd_list "$build/keel")
cp "$root/bench/run.py" "$out/bench/"
cp -r "$root/bench/reference" "$out/bench/"
cp -r "$root/configs" "$out/"
cp "$root/scripts/gpu_check.sh" "$out/scripts/"
find "$out" -name __pycache__ -prune -exec rm -rf {} +

commit="$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [ "$commit" != unknown ] &&
   [ -n "$(git -C "$root" status --porcelain -- src CMakeLists.txt configs bench scripts)" ]; then
  commit="$commit+uncommitted-changes"
fi
# The newest glibc symbol version keel or lib/ asks for; the GPU machine's glibc must have it.
glibc_min="$(objdump -T "$out/keel" "$out"/lib/* 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' |
             sed 's/GLIBC_//' | sort -uV | tail -n 1)"
{
  echo "# keel bundle for scripts/gpu_check.sh --bundle DIR; made by scripts/gpu_bundle.sh"
  echo "keel_version=$(LD_LIBRARY_PATH="$torch_lib" "$out/keel" --version)"
  echo "commit=$commit"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "torch_version=$torch_version"
  echo "glibc_min=$glibc_min"
  echo "# lib/ (Debian package of each):"
  for name in $(printf '%s\n' "${!source_of[@]}" | sort); do
    path="${source_of[$name]}"
    pkg=""
    for p in "$path" "$(readlink -f "$path")" "${path#/usr}"; do
      pkg="$(dpkg -S "$p" 2>/dev/null | head -n 1 | cut -d: -f1)" && [ -n "$pkg" ] && break
    done
    echo "#   $name from $path (${pkg:-no Debian package}), $(stat -c %s "$out/lib/$name") bytes"
  done
} >"$out/MANIFEST.txt"

# ---- check -----------------------------------------------------------------------------------
log "ldd $out/keel with LD_LIBRARY_PATH=$torch_lib:"
bad=0
declare -A count=([bundle]=0 [glibc]=0 [libtorch]=0)
while IFS=$'\t' read -r name path; do
  if [[ "$path" == "$out/lib/"* ]]; then from=bundle
  elif is_glibc "$name"; then from=glibc
  elif [ -n "${libtorch[$name]:-}" ]; then from=libtorch
  else from="NEITHER BUNDLE, GLIBC NOR LIBTORCH"; bad=1
  fi
  [ "$path" = "not found" ] && { from="NOT FOUND"; bad=1; }
  [ -n "${count[$from]+x}" ] && count[$from]=$((count[$from] + 1))
  printf '  %-28s %-9s %s\n' "$name" "$from" "$path" >&2
done < <(ldd_list "$out/keel")
log "resolved: ${count[bundle]} from the bundle, ${count[glibc]} glibc, ${count[libtorch]} LibTorch"
[ "$bad" -eq 0 ] || fail "some library comes from neither the bundle, glibc nor LibTorch (above)"

log "clean environment: env -i LD_LIBRARY_PATH=$torch_lib $out/keel --version"
version="$(env -i LD_LIBRARY_PATH="$torch_lib" "$out/keel" --version)" || fail "keel --version"
log "  $version"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
log "clean environment: a 3-step CPU run of the embedded tiny config"
# In $tmp: the run's out_dir (runs/, relative to the working directory) is checked for free space.
(cd "$tmp" && env -i LD_LIBRARY_PATH="$torch_lib" "$out/keel" train --run-dir "$tmp/run" \
   --set run.max_steps=3 --set schedule.warmup_steps=1 --set logging.progress=off) \
   >"$tmp/train.log" 2>&1 ||
  { tail -n 30 "$tmp/train.log" >&2; fail "the 3-step run from the bundle"; }
last="$(tail -n 1 "$tmp/run/metrics.jsonl")"
[[ "$last" == *'"step":3,'* ]] || fail "the 3-step run's last metrics record is not step 3: $last"
log "  ok: $(grep -o '"step":3,"loss":[^,]*' <<<"$last")"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
bytes="$(du -sb "$out" | cut -f1)"
log "bundle: $out, $(mib "$bytes") ($bytes bytes; limit 60 MiB): keel $(stat -c %s "$out/keel")" \
    "bytes, lib/ $(du -sb "$out/lib" | cut -f1) bytes in $(find "$out/lib" -type f | wc -l)" \
    "files; needs glibc >= $glibc_min"
[ "$bytes" -le "$max_bytes" ] || fail "the bundle is over 60 MiB"
# The device tool carries the working tree and the carried paths together, up to 64 MiB.
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  tree="$(cd "$root" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- |
          tail -n 1 | cut -f1)"
  log "with the working tree ($(mib "$tree")) a device call carries $(mib $((bytes + tree))) of 64"
  [ $((bytes + tree)) -le $((64 * 1024 * 1024)) ] || log "WARNING: over the device tool's 64 MiB"
fi
echo "$out"
