# keel on a CUDA machine. Uses the same scripts/setup.sh as every other machine; the CUDA base
# image provides the toolkit that LibTorch's CMake configuration needs (NCCL comes with the wheel).
# The image holds the keel binary and the test suite: scripts/build.sh builds every target.
#
# Build:     docker build -t keel .
# Train:     docker run --gpus all -v "$PWD/runs:/opt/keel/runs" keel train configs/gpt2-124m.yaml
#            (configs/ is in the image; the run directory lands in ./runs on the host)
# Validate:  docker run --gpus all --rm keel validate configs/production-124m.yaml
# Test:      docker run --rm --entrypoint ctest keel --test-dir build --output-on-failure \
#                --timeout 900 -LE 'gpu|lint'
#            the CPU suite, as scripts/test.sh runs it, less the format check (-LE lint): that
#            lists files with git, and .dockerignore keeps .git out of the image (the image's
#            clang-format is also not Debian bookworm's 14, which the code is formatted with).
FROM nvidia/cuda:13.0.1-devel-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive KEEL_CACHE=/opt/keel-cache
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv sudo \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/keel
# Packages and the torch wheel first, in their own layer: a change to the sources rebuilds keel
# without downloading LibTorch again. build.sh calls setup.sh once more (seconds, nothing missing).
COPY scripts/setup.sh scripts/setup.sh
RUN scripts/setup.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN scripts/build.sh
ENTRYPOINT ["/opt/keel/build/keel"]
