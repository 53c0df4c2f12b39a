#include "model/generate.h"

#include <algorithm>

#include "common/error.h"

namespace keel::model {
namespace {

// The next id from the last position's logits (V) fp32.
int64_t choose(const torch::Tensor& logits, const GenerateOptions& o, torch::Generator& gen) {
  if (o.temperature <= 0) return logits.argmax().item<int64_t>();
  auto scaled = logits / o.temperature;
  if (o.top_k > 0 && o.top_k < scaled.size(0)) {
    const auto kth = std::get<0>(scaled.topk(o.top_k)).min();
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<float>::infinity());
  }
  const auto probs = torch::softmax(scaled, 0);
  return torch::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
}

}  // namespace

std::vector<int64_t> generate(Transformer& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& o,
                              const std::function<void(int64_t)>& on_token) {
  if (prompt.empty()) throw UserError("generate: the prompt encodes to no tokens");
  torch::NoGradGuard no_grad;
  model->eval();
  const auto device = model->parameters().front().device();
  const int64_t window = model->config().seq_len;
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::vector<int64_t> ids = prompt, out;
  KvCache cache;
  // Fills a fresh cache with the newest ids that leave room to grow, and returns the logits of
  // the last one.
  auto refill = [&](int64_t keep) {
    cache = KvCache{};
    const int64_t n = std::min<int64_t>(keep, static_cast<int64_t>(ids.size()));
    const auto context = torch::tensor(std::vector<int64_t>(ids.end() - n, ids.end()),
                                       torch::kLong)
                             .to(device)
                             .unsqueeze(0);                                    // (1, n)
    return model->forward_cached(context, cache).select(1, n - 1).squeeze(0);  // (V)
  };
  auto logits = refill(static_cast<int64_t>(ids.size()) < window ? window : window / 2);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int64_t next = choose(logits.to(torch::kCPU, torch::kFloat), o, gen);
    ids.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
    if (o.stop_id && next == *o.stop_id) break;
    if (i + 1 == o.max_new_tokens) break;
    if (cache.length == window) {
      logits = refill(window / 2);
    } else {
      const auto step = torch::tensor({next}, torch::kLong).to(device).view({1, 1});
      logits = model->forward_cached(step, cache).select(1, 0).squeeze(0);
    }
  }
  return out;
}

}  // namespace keel::model
