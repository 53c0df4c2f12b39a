// The language-model head and its cross-entropy without the (N, V) logits: the head's matmul, the
// log-sum-exp and the target's logit are computed `chunk_rows` tokens at a time, in the forward
// pass and again in the backward pass (recomputed, not stored), so at most chunk_rows x V logits
// exist at once. Per-token values are exact (the same sums as the whole-matrix path, up to
// rounding), so per-sample losses and the screen's masks stay as they are. Under autocast the
// matmuls run in the autocast dtype and the softmax in fp32, as in the whole-matrix path.
#pragma once

#include <torch/torch.h>

#include "config/schema.h"

namespace keel::model {

// model.chunked_loss resolved for a device: on, or auto on CUDA.
inline bool chunked_loss_in_effect(const config::ModelConfig& m, bool cuda) {
  return m.chunked_loss == config::Switch::kOn || (m.chunked_loss == config::Switch::kAuto && cuda);
}

struct TokenLosses {
  torch::Tensor ce;   // (N) fp32: -log p(target), with gradient
  torch::Tensor lse;  // (N) fp32: log Z (for the z-loss), with gradient
};

// hidden (N, C), weight (V, C), targets (N) int64 in [0, V). chunk_rows >= 1.
TokenLosses linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                 const torch::Tensor& targets, int64_t chunk_rows);

// Rows per chunk for a vocabulary of `vocab` so that one chunk's fp32 logits take about
// `chunk_bytes` (at least 1 row).
int64_t loss_chunk_rows(int64_t vocab, int64_t chunk_bytes = int64_t{64} << 20);

}  // namespace keel::model
