// Derived model quantities declared in schema.h. They live here, once, so that the model builder,
// the parameter estimate and the validator agree on what a 0 ("derive it") means.
#include "config/schema.h"

namespace keel::config {

int64_t effective_d_ff(const ModelConfig& m) {
  if (m.d_ff > 0) return m.d_ff;
  if (m.arch == "gpt2") return 4 * m.d_model;
  // llama: SwiGLU keeps the MLP's parameter count near a 4*C GELU MLP with 2/3 of 4*C, then rounds
  // up to a multiple of 64 for matmul-friendly shapes (as Meta's reference: floor first, then
  // round).
  constexpr int64_t kMultiple = 64;
  const int64_t hidden = 8 * m.d_model / 3;
  return (hidden + kMultiple - 1) / kMultiple * kMultiple;
}

int64_t effective_kv_heads(const ModelConfig& m) {
  return m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
}

}  // namespace keel::config
