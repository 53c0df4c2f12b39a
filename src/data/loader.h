// The training loader: memory-mapped shards (shard_reader.h), a SampleOrder (sampler.h), and
// producer threads that assemble micro-batches ahead into a bounded queue.
//
// Ranks and positions. Global micro-batch k of the job covers order positions
// [k*B*W, (k+1)*B*W) for micro-batch B and world size W; rank r takes its contiguous chunk of B,
// so ranks read disjoint samples and together cover the order one rank would have seen. A batch's
// sample_ids are window ids: window w holds stream tokens [w*T, w*T+T+1), and the document index
// (ShardSet::document_at) traces it back to its documents and input files.
//
// Backpressure. next() takes the oldest ready batch; when fewer than low_watermark are ready it
// first waits until high_watermark are (or the stream cannot give more). A wait in which no batch
// arrives for stall_timeout_s throws keel::RunStopped (exit 3) naming the timeout. Batches are
// never padded, repeated or skipped. take_stats() reports the waits.
//
// Faults (config `faults`, training source only):
//   loader_stall {at_step, steps, seconds}  the producer sleeps `seconds` before the first
//                                           micro-batch of each step in [at_step, at_step+steps)
//   drop_samples {at_step, factor}          from at_step on, each sample the producer takes from
//                                           the order is lost with probability `factor`; the batch
//                                           is filled from the following ones. samples_served()
//                                           counts the lost ones too, so the trainer's
//                                           consumed-vs-steps cross-check sees the deviation.
// A step is micro-batch index / grad_accum_steps.
//
// Thread-safety: next(), state(), load_state() and take_stats() are for one consumer thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/schema.h"
#include "data/batch.h"
#include "data/provenance.h"
#include "data/sampler.h"
#include "data/shard_reader.h"
#include "data/tokenizer.h"

namespace keel::data {

struct LoaderOptions {
  config::DataSource source = config::DataSource::kShards;
  std::string dir;  // dataset directory (meta.json); megatron / llmc: data.path's files
  std::string split = "train";
  double held_out = 0.0;  // megatron / llmc: the share of documents that is "val"
  int64_t seq_len = 128;  // T: windows hold T+1 tokens
  int rank = 0, world_size = 1;
  int64_t grad_accum_steps = 1;  // micro-batches per step (for fault steps)
  int64_t model_vocab_size = 0;  // > 0: refuse data whose vocabulary does not fit the model
  SamplerConfig sampler;
  config::LoaderConfig loader;
  std::vector<config::FaultSpec> faults;  // loader_stall / drop_samples are honoured
  // The run's validation data (data.val_path, or data.path's val split): its log lines and errors
  // say "validation" whichever split it reads, and a split with fewer windows than a global
  // micro-batch serves smaller micro-batches instead of refusing.
  bool validation = false;
};

class ShardLoader : public BatchSource {
 public:
  // Opens and verifies the dataset (throws DataError); starts producing on the first next().
  explicit ShardLoader(LoaderOptions options);
  ~ShardLoader() override;
  ShardLoader(const ShardLoader&) = delete;
  ShardLoader& operator=(const ShardLoader&) = delete;

  Batch next() override;
  nlohmann::json state() const override;
  void load_state(const nlohmann::json& state) override;
  int64_t samples_served() const override { return served_; }
  LoaderStats take_stats() override;
  std::string decode(const torch::Tensor& tokens) const override;
  nlohmann::json locate(int64_t id) const override;

  const ShardSet& shards() const { return *set_; }
  int64_t epoch_length() const { return order_->epoch_length(); }
  uint32_t bucket_of(int64_t window) const { return order_->bucket_of(window); }

 private:
  struct Cursor {
    int64_t micro_batches = 0;  // micro-batches taken by this rank
    int64_t chunk = 0;          // this rank's next chunk of B order positions
    int64_t offset = 0;         // position inside it (non-zero only after drop_samples)
    int64_t taken = 0;          // order positions taken, including lost ones
  };
  struct Item {
    Batch batch;
    Cursor end;
  };
  void start();
  void stop();
  void worker();
  std::vector<int64_t> plan(Cursor& cursor);  // under mu_
  double drop_fraction(int64_t micro_batch) const;
  double stall_seconds(int64_t micro_batch) const;
  int64_t ready_run() const;  // consecutive ready batches from the consumer's next one (under mu_)

  LoaderOptions options_;
  std::unique_ptr<ShardSet> set_;
  std::unique_ptr<SampleOrder> order_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Provenance> provenance_;  // prepared shards only

  mutable std::mutex mu_;
  std::condition_variable produced_, consumed_;
  std::vector<std::thread> workers_;
  bool running_ = false, stopping_ = false;
  std::exception_ptr error_;
  Cursor plan_cursor_;             // producer side
  Cursor committed_;               // consumer side: the position state() saves
  std::map<int64_t, Item> ready_;  // micro-batch index -> batch
  int64_t served_ = 0;
  LoaderStats stats_;
  std::chrono::steady_clock::time_point last_arrival_;  // when a producer last delivered
};

// The factory the trainer uses. validation=true reads the val split of data.path (or the
// dataset at data.val_path: its val split if it has one, else its train split), sequentially,
// with no faults. megatron / llmc: data.val_path in the same format is read whole; without one,
// the last documents of data.path are held out (kForeignHeldOutShare) and training never sees
// them.
std::unique_ptr<BatchSource> make_shard_source(const config::Config& cfg, int rank, int world_size,
                                               bool validation);

}  // namespace keel::data
