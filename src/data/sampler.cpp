#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

namespace keel::data {

SampleOrder::SampleOrder(SamplerConfig config, std::vector<uint32_t> window_bucket)
    : config_(std::move(config)), bucket_(std::move(window_bucket)) {
  config_.buckets = std::max<int64_t>(config_.buckets, 1);
  for (auto& b : bucket_) b %= static_cast<uint32_t>(config_.buckets);
  if (config_.kind == config::Sampling::kStratified) {
    order_ = build(0);  // every epoch places the same number of windows (see build)
    cached_epoch_ = 0;
    epoch_length_ = static_cast<int64_t>(order_.size());
  } else {
    epoch_length_ = windows();
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
  const int64_t n = windows();
  std::mt19937_64 rng(config_.seed * 0x9E3779B97F4A7C15ull +
                      static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull + 1);
  std::vector<int64_t> order;
  if (config_.kind != config::Sampling::kStratified) {
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    if (config_.kind == config::Sampling::kRandom) std::shuffle(order.begin(), order.end(), rng);
    return order;
  }
  // Stratified. Each position takes the fullest bucket not taken in the previous m - 1 positions
  // (ties broken at random), so any m consecutive positions of an epoch hold m buckets. Which
  // bucket a pick takes depends only on the remaining counts and recent picks, and buckets tied on
  // both are interchangeable, so the number of placeable windows, E, is the same every epoch.
  const int64_t K = config_.buckets;
  std::vector<std::vector<int64_t>> lists(K);
  for (int64_t w = 0; w < n; ++w) lists[bucket_[w]].push_back(w);
  for (auto& l : lists) std::shuffle(l.begin(), l.end(), rng);
  std::vector<size_t> next(K, 0);
  int64_t nonempty = 0;
  for (auto& l : lists) nonempty += !l.empty();
  const int64_t m = std::min(config_.min_clusters, std::max<int64_t>(nonempty, 1));
  std::vector<int64_t> last_taken(K, -m);  // the position each bucket last filled
  order.reserve(n);
  for (int64_t position = 0;; ++position) {
    int64_t best = -1;
    size_t best_left = 0;
    uint64_t tied = 0;
    for (int64_t b = 0; b < K; ++b) {
      const size_t left = lists[b].size() - next[b];
      if (left == 0 || position - last_taken[b] < m) continue;
      if (left > best_left) {
        best = b;
        best_left = left;
        tied = 1;
      } else if (left == best_left && rng() % ++tied == 0) {
        best = b;  // each of the tied buckets with probability 1 / tied
      }
    }
    if (best < 0) break;  // what is left waits for a later epoch
    last_taken[best] = position;
    order.push_back(lists[best][next[best]++]);
  }
  return order;
}

}  // namespace keel::data
