// Text generation from a trained model: a prompt's ids in, new ids out, one position's forward
// per token through the model's KV cache. Greedy at temperature 0 (deterministic); otherwise
// sampling from softmax(logits / temperature), restricted to the top_k most likely ids when
// top_k > 0, from a generator seeded with `seed` (the same seed gives the same text).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/transformer.h"

namespace keel::model {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: the whole vocabulary
  uint64_t seed = 0;
  std::optional<int64_t> stop_id;  // generation ends after this id (the document boundary)
};

// Returns the new ids (not the prompt). `on_token` sees each id as it is chosen (streaming).
// The context is the model's seq_len: when prompt and output outgrow it, the window slides to
// the newest seq_len / 2 ids (one full forward to refill the cache), so output may go on.
// Throws UserError for an empty prompt.
std::vector<int64_t> generate(Transformer& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& options,
                              const std::function<void(int64_t)>& on_token = {});

}  // namespace keel::model
