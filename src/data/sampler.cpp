#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

namespace keel::data {

SampleOrder::SampleOrder(SamplerConfig config, std::vector<uint32_t> window_bucket)
    : config_(std::move(config)), bucket_(std::move(window_bucket)) {
  if (config_.micro_batch < 1) throw std::invalid_argument("micro_batch must be positive");
  config_.buckets = std::max<int64_t>(config_.buckets, 1);
  for (auto& b : bucket_) b %= static_cast<uint32_t>(config_.buckets);
  if (config_.kind == config::Sampling::kStratified) {
    order_ = build(0);  // every epoch places the same number of windows (see build)
    cached_epoch_ = 0;
    epoch_length_ = static_cast<int64_t>(order_.size());
  } else {
    epoch_length_ = windows() / config_.micro_batch * config_.micro_batch;
  }
}

int64_t SampleOrder::at(int64_t g) {
  if (epoch_length_ <= 0) throw std::logic_error("SampleOrder::at on an empty order");
  int64_t epoch = g / epoch_length_;
  if (epoch != cached_epoch_) {
    order_ = build(epoch);
    cached_epoch_ = epoch;
  }
  return order_[g % epoch_length_];
}

std::vector<int64_t> SampleOrder::build(int64_t epoch) const {
  const int64_t n = windows(), B = config_.micro_batch;
  std::mt19937_64 rng(config_.seed * 0x9E3779B97F4A7C15ull +
                      static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull + 1);
  std::vector<int64_t> order;
  if (config_.kind != config::Sampling::kStratified) {
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    if (config_.kind == config::Sampling::kRandom) std::shuffle(order.begin(), order.end(), rng);
    order.resize(n / B * B);
    return order;
  }
  // Stratified. Which bucket a pick takes depends only on the remaining counts (ties broken by a
  // random priority), so the number of placeable chunks, and with it E, is the same every epoch.
  const int64_t K = config_.buckets;
  std::vector<std::vector<int64_t>> lists(K);
  for (int64_t w = 0; w < n; ++w) lists[bucket_[w]].push_back(w);
  for (auto& l : lists) std::shuffle(l.begin(), l.end(), rng);
  std::vector<size_t> next(K, 0);
  int64_t nonempty = 0;
  for (auto& l : lists) nonempty += !l.empty();
  const int64_t need = std::min({config_.min_clusters, B, std::max<int64_t>(nonempty, 1)});
  std::vector<uint64_t> priority(K);
  std::vector<char> used(K);
  std::vector<int64_t> chunk;
  order.reserve(n);
  while (true) {
    for (auto& p : priority) p = rng();
    std::fill(used.begin(), used.end(), 0);
    chunk.clear();
    int64_t distinct = 0;
    for (int64_t j = 0; j < B; ++j) {
      // The first `need` picks take the fullest buckets not yet in this chunk; the rest the
      // fullest overall, so a dominant bucket fills what the constraint leaves free.
      int64_t best = -1;
      for (int64_t b = 0; b < K; ++b) {
        size_t left = lists[b].size() - next[b];
        if (left == 0 || (j < need && used[b])) continue;
        if (best < 0) {
          best = b;
          continue;
        }
        size_t best_left = lists[best].size() - next[best];
        if (left > best_left || (left == best_left && priority[b] > priority[best])) best = b;
      }
      if (best < 0) break;
      distinct += !used[best];
      used[best] = 1;
      chunk.push_back(lists[best][next[best]++]);
    }
    if (static_cast<int64_t>(chunk.size()) < B || distinct < need) break;
    std::shuffle(chunk.begin(), chunk.end(), rng);
    order.insert(order.end(), chunk.begin(), chunk.end());
  }
  return order;
}

}  // namespace keel::data
