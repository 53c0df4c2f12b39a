/**
 * Copyright (c) 2017-present, Facebook, Inc.
 * All rights reserved.
 *
 * This source code is licensed under the BSD-style license found in the
 * LICENSE file in the root directory of this source tree.
 */

// keel: gloo/config.h as gloo's CMake would generate it from gloo/config.h.in (commit 3135b0b)
// inside the torch 2.11.0 build of the wheel (+cu130, Linux x86-64); VERSION beside LICENSE says
// how each value was checked. None of the vendored headers includes this file (c10d's
// GlooDeviceFactory.hpp does); of them only math.h reads a value (GLOO_USE_AVX, 0 here and 0
// when undefined), so no vendored declaration changes with these settings.

#pragma once

#define GLOO_VERSION_MAJOR 0
#define GLOO_VERSION_MINOR 5
#define GLOO_VERSION_PATCH 0

static_assert(
    GLOO_VERSION_MINOR < 100,
    "Programming error: you set a minor version that is too big.");
static_assert(
    GLOO_VERSION_PATCH < 100,
    "Programming error: you set a patch version that is too big.");

#define GLOO_VERSION                                         \
  (GLOO_VERSION_MAJOR * 10000 + GLOO_VERSION_MINOR * 100 +   \
   GLOO_VERSION_PATCH)

// torch builds gloo with its own USE_CUDA (gloo_cuda is linked into libtorch_cuda), with NCCL and
// RCCL switched off around add_subdirectory(third_party/gloo), and without ROCm, Redis, ibverbs
// (USE_GLOO_IBVERBS is off), MPI, AVX half-precision kernels or libuv (Windows only).
#define GLOO_USE_CUDA 1
#define GLOO_USE_NCCL 0
#define GLOO_USE_ROCM 0
#define GLOO_USE_RCCL 0
#define GLOO_USE_REDIS 0
#define GLOO_USE_IBVERBS 0
#define GLOO_USE_MPI 0
#define GLOO_USE_AVX 0
#define GLOO_USE_LIBUV 0

// Linux: the epoll TCP transport, and its TLS variant (torch sets USE_TCP_OPENSSL_LOAD for
// USE_GLOO_WITH_OPENSSL; gloo::transport::tcp::tls symbols are in libtorch_cpu.so).
#define GLOO_HAVE_TRANSPORT_TCP 1
#define GLOO_HAVE_TRANSPORT_TCP_TLS 1
#define GLOO_HAVE_TRANSPORT_IBVERBS 0
#define GLOO_HAVE_TRANSPORT_UV 0

// torch sets GLOO_USE_TORCH_DTYPES 1 (c10::Half / c10::BFloat16 in gloo's CUDA kernels).
#define GLOO_USE_TORCH_DTYPES 1
