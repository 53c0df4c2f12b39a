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
    // The greedy order places the most windows, and the same number whatever its ties: that is
    // every epoch's length.
    epoch_length_ = static_cast<int64_t>(stratified_greedy(0).size());
    order_ = build(0);
    cached_epoch_ = 0;
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

std::mt19937_64 SampleOrder::epoch_rng(int64_t epoch, uint64_t stream) const {
  return std::mt19937_64(config_.seed * 0x9E3779B97F4A7C15ull +
                         static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull + 1 + stream);
}

std::vector<std::vector<int64_t>> SampleOrder::shuffled_buckets(std::mt19937_64& rng) const {
  std::vector<std::vector<int64_t>> lists(config_.buckets);
  for (int64_t w = 0; w < windows(); ++w) lists[bucket_[w]].push_back(w);
  for (auto& l : lists) std::shuffle(l.begin(), l.end(), rng);
  return lists;
}

int64_t SampleOrder::spacing(const std::vector<std::vector<int64_t>>& lists) const {
  int64_t nonempty = 0;
  for (const auto& l : lists) nonempty += !l.empty();
  return std::min(config_.min_clusters, std::max<int64_t>(nonempty, 1));
}

std::vector<int64_t> SampleOrder::build(int64_t epoch) const {
  if (config_.kind != config::Sampling::kStratified) {
    std::vector<int64_t> order(windows());
    std::iota(order.begin(), order.end(), 0);
    auto rng = epoch_rng(epoch, 0);
    if (config_.kind == config::Sampling::kRandom) std::shuffle(order.begin(), order.end(), rng);
    return order;
  }
  std::vector<int64_t> order = stratified_proportional(epoch);
  return static_cast<int64_t>(order.size()) == epoch_length_ ? order : stratified_greedy(epoch);
}

// Each position takes the fullest bucket not taken in the previous m - 1 positions (ties at
// random): the most windows any order can place under the constraint.
std::vector<int64_t> SampleOrder::stratified_greedy(int64_t epoch) const {
  auto rng = epoch_rng(epoch, 0);
  auto lists = shuffled_buckets(rng);
  const int64_t K = config_.buckets, m = spacing(lists);
  std::vector<size_t> next(K, 0);
  std::vector<int64_t> last_taken(K, -m);  // the position each bucket last filled
  std::vector<int64_t> order;
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

// Each position draws its bucket in proportion to the windows it has left, among those the
// previous m - 1 positions did not take, so every stretch of the epoch mixes the clusters as the
// whole epoch does (the greedy order drains the largest first, and a cluster may then first appear
// half-way through, as a shift in the data). A bucket with more left than the positions to come
// can space out is taken first. Returns fewer than epoch_length_ windows when the draw paints
// itself into a corner; build() then takes the greedy order.
std::vector<int64_t> SampleOrder::stratified_proportional(int64_t epoch) const {
  auto rng = epoch_rng(epoch, 1);
  auto lists = shuffled_buckets(rng);
  const int64_t K = config_.buckets, m = spacing(lists);
  std::vector<size_t> next(K, 0);
  std::vector<int64_t> last_taken(K, -m);
  std::vector<int64_t> order;
  order.reserve(epoch_length_);
  std::vector<int64_t> eligible(K);  // per bucket: windows left, 0 when it may not be taken now
  for (int64_t position = 0; position < epoch_length_; ++position) {
    const int64_t to_come = epoch_length_ - position;
    int64_t urgent = -1, urgent_left = 0, eligible_left = 0;
    for (int64_t b = 0; b < K; ++b) {
      const auto left = static_cast<int64_t>(lists[b].size() - next[b]);
      eligible[b] = position - last_taken[b] < m ? 0 : left;
      eligible_left += eligible[b];
      if (eligible[b] > 0 && (left - 1) * m + 1 >= to_come && left > urgent_left) {
        urgent = b;
        urgent_left = left;
      }
    }
    if (eligible_left == 0) break;
    int64_t pick = urgent;
    if (pick < 0) {
      auto draw = static_cast<int64_t>(rng() % static_cast<uint64_t>(eligible_left));
      for (pick = 0; draw >= eligible[pick]; ++pick) draw -= eligible[pick];
    }
    last_taken[pick] = position;
    order.push_back(lists[pick][next[pick]++]);
  }
  return order;
}

}  // namespace keel::data
