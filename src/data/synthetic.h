// The embedded default data: an order-1 chain over the vocabulary with an exactly known entropy
// rate, so a user can see how close training got to the best any model can do.
//
// Each token's successor is (P[x] + j) mod V, where P is a seeded random permutation of the
// vocabulary and j ~ Zipf(s) over {0..branching-1}. For a fixed j the map x -> (P[x] + j) mod V is
// a permutation, so the transition matrix is a mixture of permutation matrices: doubly stochastic,
// with the uniform distribution stationary. Starting each sample from a uniform token keeps the
// chain stationary from the first position, and every successor set has `branching` distinct
// members, so each prediction's conditional entropy is exactly H(Zipf) — the floor of the loss
// for a model that sees the previous token (every target's predecessor is in its input).
#pragma once

#include <cstdint>
#include <vector>

#include "data/batch.h"

namespace keel::data {

class SyntheticChain {
 public:
  SyntheticChain(int64_t vocab_size, int64_t branching, double zipf_exponent, uint64_t seed);

  // Entropy rate in nats/token: the cross-entropy floor.
  double entropy_rate() const { return entropy_; }
  // Writes sample `sample_id`'s `length` tokens; deterministic in (seed, sample_id).
  void generate(int64_t sample_id, int64_t length, int64_t* out) const;
  int64_t vocab_size() const { return vocab_size_; }

 private:
  int64_t vocab_size_;
  uint64_t seed_;
  std::vector<int64_t> permutation_;
  std::vector<double> cumulative_;  // cumulative Zipf probabilities over offsets
  double entropy_ = 0.0;
};

// Serves micro-batches from a SyntheticChain. Sample ids run globally in order: micro-batch k of
// the whole job (all ranks) holds ids [k*B*W, (k+1)*B*W); rank r takes its contiguous B of them, so
// ranks read disjoint samples and together cover the order one rank would have seen.
class SyntheticSource : public BatchSource {
 public:
  SyntheticSource(SyntheticChain chain, int64_t micro_batch, int64_t seq_len, int rank,
                  int world_size, int64_t first_sample_id = 0);
  Batch next() override;
  nlohmann::json state() const override;
  void load_state(const nlohmann::json& state) override;
  int64_t samples_served() const override { return served_; }
  std::string decode(const torch::Tensor& tokens) const override;
  const SyntheticChain& chain() const { return chain_; }

 private:
  SyntheticChain chain_;
  int64_t micro_batch_, seq_len_;
  int rank_, world_size_;
  int64_t first_sample_id_;
  int64_t micro_batches_done_ = 0;  // global micro-batch counter (the position)
  int64_t served_ = 0;
};

}  // namespace keel::data
