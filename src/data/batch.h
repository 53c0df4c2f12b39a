// What the loader hands the trainer: a micro-batch of token windows and the ids of the samples
// they came from, so a per-sample loss can always be traced back to its document.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace keel::data {

struct Batch {
  torch::Tensor tokens;      // (B, T+1) int64: inputs are [:, :-1], targets [:, 1:]
  torch::Tensor sample_ids;  // (B) int64: global sample ids
  // Shards only (undefined otherwise), for the data statistics: the length of the document each
  // window starts in, and the sampler's bucket (cluster) of each window. (B) int64 each.
  torch::Tensor doc_lengths;
  torch::Tensor buckets;
};

// What the loader measured since the last call to take_stats(): how long the trainer waited for
// data (the backpressure wait below the low watermark) and how full the queue is now.
struct LoaderStats {
  double wait_ms = 0.0;     // total time next() blocked
  int64_t waits = 0;        // number of low-watermark waits
  int64_t queue_depth = 0;  // batches ready now
};

// A stream of micro-batches for one rank. Its position is a small serialisable state: a resumed
// run that loads it continues with exactly the same samples.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;
  virtual nlohmann::json state() const = 0;
  virtual void load_state(const nlohmann::json& state) = 0;
  // Samples this rank has served so far.
  virtual int64_t samples_served() const = 0;
  virtual LoaderStats take_stats() { return {}; }
  // Turns token ids back into readable text for forensics (best effort).
  virtual std::string decode(const torch::Tensor& tokens) const = 0;
  // Where sample `id` comes from, for quarantine.jsonl: {shard, offset, doc_id} for shards (the
  // shard file and the token offset inside it), empty when the source has no files.
  virtual nlohmann::json locate(int64_t id) const { return nlohmann::json::object(); }
};

}  // namespace keel::data
