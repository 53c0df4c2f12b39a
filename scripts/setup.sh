#!/usr/bin/env bash
# Installs everything keel builds against, idempotently:
#   - Debian packages (compiler toolchain, yaml-cpp, CLI11, spdlog/fmt, GoogleTest, nlohmann-json,
#     xxHash, SentencePiece, PCRE2 and utf8proc (Hugging Face tokenizer.json), zstd, ccache, fortunes corpus; Slurm and munge, whose daemons
#     tests/integration/slurm_test.cpp starts as a one-node cluster);
#   - LibTorch from the pinned `torch` wheel into a per-user cache shared by every clone
#     ($KEEL_CACHE, default ~/.cache/keel), so a fresh clone never downloads it again; Arrow and
#     Parquet's C++ libraries from the pinned `pyarrow` wheel beside it.
# Prints the LibTorch CMake prefix on its last line. A second run with everything present takes seconds.
set -euo pipefail

TORCH_VERSION="2.11.0"   # pinned; the GPU machine runs the same release
NUMPY_VERSION="2.3.5"
TENSORBOARD_VERSION="2.21.0"   # tests/tools/read_tensorboard.py reads keel's event files with it
# tests/tools/hf_check.py loads `keel export`'s output with Hugging Face's own code.
TRANSFORMERS_VERSION="5.23.0"
SAFETENSORS_VERSION="0.8.0"
TOKENIZERS_VERSION="0.23.3"
SENTENCEPIECE_PY_VERSION="0.2.3"
# Apache Arrow's C++ libraries and headers (libarrow, libparquet) for `keel prepare`'s parquet
# input, from the pyarrow wheel (as LibTorch comes from the torch wheel; same C++11 ABI); the
# tests write their parquet files with it too.
PYARROW_VERSION="26.0.1"
CACHE="${KEEL_CACHE:-$HOME/.cache/keel}"
VENV="$CACHE/torch-$TORCH_VERSION"

DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config python3-venv
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libxxhash-dev libsentencepiece-dev libpcre2-dev libutf8proc-dev libzstd-dev zlib1g-dev zstd fortunes
  clang-format chromium-headless-shell
  slurmd slurmctld slurm-client munge
)

log() { echo "[setup] $*" >&2; }

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >&2
fi

stamp="$VENV/.keel-complete"
if [ ! -f "$stamp" ]; then
  log "installing torch==$TORCH_VERSION into $VENV (once per machine)"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --progress-bar off "torch==$TORCH_VERSION" "numpy==$NUMPY_VERSION" >&2
  touch "$stamp"
fi
# Python packages the tests read keel's output with (tests/tools/), each pinned, in the same
# environment. A stamp named by the versions, so that a machine set up before a package was added
# (or before a version bump) installs it on its next run.
PY_TEST_PACKAGES=("tensorboard==$TENSORBOARD_VERSION" "transformers==$TRANSFORMERS_VERSION"
  "safetensors==$SAFETENSORS_VERSION" "tokenizers==$TOKENIZERS_VERSION"
  "sentencepiece==$SENTENCEPIECE_PY_VERSION" "pyarrow==$PYARROW_VERSION")
py_stamp="$VENV/.keel-py-$(echo "${PY_TEST_PACKAGES[*]}" | tr ' =' '_-')"
if [ ! -f "$py_stamp" ]; then
  log "installing ${PY_TEST_PACKAGES[*]} into $VENV"
  "$VENV/bin/pip" install -q --progress-bar off "${PY_TEST_PACKAGES[@]}" >&2
  touch "$py_stamp"
fi
"$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'
