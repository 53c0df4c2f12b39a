#include "data/synthetic.h"

#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include "common/error.h"

namespace keel::data {
namespace {

// SplitMix64: a counter-based generator, so sample k is generated without touching samples < k.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

}  // namespace

SyntheticChain::SyntheticChain(int64_t vocab_size, int64_t branching, double zipf_exponent,
                               uint64_t seed)
    : vocab_size_(vocab_size), seed_(seed) {
  permutation_.resize(vocab_size);
  std::iota(permutation_.begin(), permutation_.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(permutation_.begin(), permutation_.end(), rng);

  branching = std::min(branching, vocab_size);
  std::vector<double> p(branching);
  double total = 0.0;
  for (int64_t j = 0; j < branching; ++j) total += p[j] = std::pow(j + 1.0, -zipf_exponent);
  double acc = 0.0;
  for (int64_t j = 0; j < branching; ++j) {
    p[j] /= total;
    acc += p[j];
    cumulative_.push_back(acc);
    entropy_ -= p[j] * std::log(p[j]);
  }
  cumulative_.back() = 1.0;
}

void SyntheticChain::generate(int64_t sample_id, int64_t length, int64_t* out) const {
  SplitMix64 rng{seed_ * 0x2545F4914F6CDD1Dull +
                 static_cast<uint64_t>(sample_id) * 0x9E3779B97F4A7C15ull};
  rng.next();
  int64_t x = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(vocab_size_));
  for (int64_t t = 0; t < length; ++t) {
    out[t] = x;
    double u = rng.uniform();
    int64_t j = 0;
    while (u >= cumulative_[j]) ++j;
    x = (permutation_[x] + j) % vocab_size_;
  }
}

SyntheticSource::SyntheticSource(SyntheticChain chain, int64_t micro_batch, int64_t seq_len,
                                 int rank, int world_size, int64_t first_sample_id)
    : chain_(std::move(chain)),
      micro_batch_(micro_batch),
      seq_len_(seq_len),
      rank_(rank),
      world_size_(world_size),
      first_sample_id_(first_sample_id) {}

Batch SyntheticSource::next() {
  auto tokens = torch::empty({micro_batch_, seq_len_ + 1}, torch::kInt64);
  auto ids = torch::empty({micro_batch_}, torch::kInt64);
  int64_t base = first_sample_id_ + (micro_batches_done_ * world_size_ + rank_) * micro_batch_;
  auto* tok = tokens.data_ptr<int64_t>();
  auto* id = ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < micro_batch_; ++b) {
    id[b] = base + b;
    chain_.generate(id[b], seq_len_ + 1, tok + b * (seq_len_ + 1));
  }
  ++micro_batches_done_;
  served_ += micro_batch_;
  Batch batch;
  batch.tokens = tokens;
  batch.sample_ids = ids;
  return batch;
}

nlohmann::json SyntheticSource::state() const {
  return {{"kind", "synthetic"},
          {"micro_batches_done", micro_batches_done_},
          {"served", served_},
          {"micro_batch", micro_batch_},
          {"world_size", world_size_}};
}

void SyntheticSource::load_state(const nlohmann::json& state) {
  micro_batches_done_ = state.at("micro_batches_done").get<int64_t>();
  served_ = state.at("served").get<int64_t>();
  if (!state.contains("micro_batch") || !state.contains("world_size")) return;
  // Saved by another micro-batch x world layout (a resume at another world size): the same global
  // position in the new layout, when it is a whole number of the new global micro-batches.
  const int64_t saved_batch = state.at("micro_batch").get<int64_t>();
  const int64_t saved_world = state.at("world_size").get<int64_t>();
  if (saved_batch == micro_batch_ && saved_world == world_size_) return;
  const int64_t saved = saved_batch * saved_world, now = micro_batch_ * world_size_;
  const int64_t global = micro_batches_done_ * saved;
  if (global % now != 0)
    throw DataError("data position in the checkpoint: " + std::to_string(global) + " (saved with " +
                    std::to_string(saved) +
                    " samples per global micro-batch) is not a whole number of this run's " +
                    std::to_string(now));
  micro_batches_done_ = global / now;
  served_ = micro_batches_done_ * micro_batch_;
}

std::string SyntheticSource::decode(const torch::Tensor& tokens) const {
  auto t = tokens.to(torch::kCPU).to(torch::kInt64).contiguous();
  std::ostringstream out;
  for (int64_t i = 0; i < t.numel(); ++i) out << (i ? " " : "") << t.data_ptr<int64_t>()[i];
  return out.str();
}

}  // namespace keel::data
