# keel on a CUDA machine. Uses the same scripts/setup.sh as every other machine; the CUDA base
# image provides the toolkit that LibTorch's CMake configuration needs (NCCL comes with the wheel).
# Build: docker build -t keel .   Run: docker run --gpus all keel train configs/gpt2-124m.yaml
FROM nvidia/cuda:13.0.1-devel-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive KEEL_CACHE=/opt/keel-cache
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv sudo git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/keel
COPY . .
RUN scripts/setup.sh && scripts/build.sh --target keel
ENTRYPOINT ["/opt/keel/build/keel"]
