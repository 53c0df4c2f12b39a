// The data order: which training window sits at each global position. Positions run across epochs
// (position g is index g % E of epoch g / E, E = epoch_length()), and every epoch's order is a pure
// function of (sampler, seed, epoch), so a position is all the state a resumed run needs. The order
// depends on neither the micro-batch size nor the world size: a run resumed at another layout with
// the same global batch trains on exactly the samples the uninterrupted run would have.
//
//   sequential  windows in stream order
//   random      a seeded permutation per epoch
//   stratified  windows grouped by bucket (their first document's cluster id mod `buckets`),
//               shuffled within each bucket; each position draws a bucket that none of the
//               previous m - 1 positions took (m = min(min_clusters, non-empty buckets)), in
//               proportion to the windows it has left, so any m consecutive positions of an epoch
//               — and with them every micro-batch of at least m samples, wherever it starts — span
//               m clusters, and every stretch of the epoch mixes the clusters as the whole epoch
//               does. The epoch's length E is what the greedy order (fullest bucket first) places;
//               windows the constraint cannot place (when one bucket dominates) wait for a later
//               epoch. Only the seam between two epochs is exempt.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "config/schema.h"

namespace keel::data {

struct SamplerConfig {
  config::Sampling kind = config::Sampling::kStratified;
  uint64_t seed = 1234;
  int64_t micro_batch = 8;  // the loader's; the order does not depend on it
  int64_t buckets = 16;
  int64_t min_clusters = 2;
};

class SampleOrder {
 public:
  // `window_bucket[w]` in [0, buckets) for each window w (used by stratified only).
  SampleOrder(SamplerConfig config, std::vector<uint32_t> window_bucket);
  int64_t windows() const { return static_cast<int64_t>(bucket_.size()); }
  int64_t epoch_length() const { return epoch_length_; }
  // The window at global position g. Not thread-safe (caches the current epoch's order).
  int64_t at(int64_t g);
  uint32_t bucket_of(int64_t window) const { return bucket_[window]; }
  const SamplerConfig& config() const { return config_; }

 private:
  std::vector<int64_t> build(int64_t epoch) const;
  std::vector<int64_t> stratified_greedy(int64_t epoch) const;
  std::vector<int64_t> stratified_proportional(int64_t epoch) const;
  // `stream` keeps the draws of the two stratified orders apart.
  std::mt19937_64 epoch_rng(int64_t epoch, uint64_t stream) const;
  std::vector<std::vector<int64_t>> shuffled_buckets(std::mt19937_64& rng) const;
  int64_t spacing(const std::vector<std::vector<int64_t>>& lists) const;  // m
  SamplerConfig config_;
  std::vector<uint32_t> bucket_;
  int64_t epoch_length_ = 0;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace keel::data
