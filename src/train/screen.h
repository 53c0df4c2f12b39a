// The per-sample screen (the seed's §3.2) in one place, from threshold to quarantine record:
//   bounds       the step's high bound (samples far above the per-sample baseline are masked)
//                and low bound (memorised or repeated data), from the guard's baseline;
//   masks        a micro-batch's kept mask on the device: above the high bound out, NaN in (the
//                guard's), and under stability.screen.low: quarantine the low side out too
//                (content seen before under another id, a loss below the low bound);
//   the host     the step's samples as the host read them, sorted into the guard's signals
//                (kept, masked, low losses; repeats) and the step's account (HostSamples);
//   records      the masked samples in quarantine.jsonl, named in the guard's screen and
//                repeated-data events.
//
// Owns: the repeat watch (every rank's (fingerprint, id) pairs, the same on every rank) and the
// quarantine record. Called by: setup.cpp (open), trainer.cpp (bounds), forward_backward.cpp
// (fingerprints, low_side_keep), verdict.cpp (observe, name_low_samples, quarantine_masked),
// recovery.cpp (through quarantine()), snapshot.cpp (the watch's state). Writes: quarantine.jsonl.
// Saves: the repeat watch as the checkpoint's extra tensor "repeat_watch" (guard on), loaded by a
// resume and kept through a rollback; the quarantine's ids since the newest stable snapshot are
// not saved (a record, not a figure training reads). One per trainer, one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "config/schema.h"
#include "data/batch.h"
#include "guard/guard.h"
#include "guard/repeats.h"
#include "monitor/run_files.h"
#include "train/counters.h"
#include "train/host_read.h"
#include "train/quarantine.h"
#include "train/step_values.h"

namespace keel::train {

class Screen {
 public:
  // The bounds of one step: none while the screen is off (no guard, screen disabled, or its
  // baseline too young); low only with high.
  struct Bounds {
    std::optional<double> high, low;
  };

  Screen() = default;  // screens nothing and records nothing until opened
  // `guard` (null: no screen), `file` (quarantine.jsonl) and `data` (where a sample is) outlive
  // this object.
  void open(const config::StabilityConfig& cfg, const guard::Guard* guard, monitor::JsonlFile& file,
            const data::BatchSource& data);

  Bounds bounds(int64_t step) const;

  // One content fingerprint per window of `tokens` (B, T+1) int64: its xxh3, as int64.
  static std::vector<int64_t> fingerprints(const torch::Tensor& tokens);
  // The micro-batch's kept mask, (B) fp32 on the device: samples above `threshold` (() on the
  // device) weigh 0, NaN ones 1 (the guard's), and `low_keep` (defined: the low side's mask)
  // multiplies it.
  static torch::Tensor keep_mask(const torch::Tensor& per_sample_loss,
                                 const torch::Tensor& threshold, const torch::Tensor& low_keep);
  // Whether a step screened with `b` masks the low side (stability.screen.low: quarantine).
  bool masks_low_side(const Bounds& b) const;
  // The low side's mask for one micro-batch, (B) fp32 on the device: 0 for its samples that repeat
  // content seen under another id or lie below `low`, 1 otherwise (NaN losses are the guard's).
  torch::Tensor low_side_keep(const torch::Tensor& per_sample_loss, const data::Batch& batch,
                              const std::vector<int64_t>& fingerprints,
                              std::optional<double> low) const;

  // The step's samples as the host read them (every rank's, in rank order) into the guard's
  // signals and the step's account `out`; their fingerprints then join the repeat watch.
  void observe(const HostFigures& h, const Bounds& b, guard::StepSignals& s, HostSamples& out);
  // Names the step's repeated and low samples (else its lowest-loss ones), with where they are
  // in the data, in the decision's warnings about repeated data.
  void name_low_samples(const HostSamples& samples, guard::Decision& d) const;
  // The step's masked samples into quarantine.jsonl (the low side's under their own reasons),
  // the worst named in the decision's screen events.
  void quarantine_masked(const HostSamples& samples, const TrainCounters& at, guard::Decision& d);

  Quarantine& quarantine() { return quarantine_; }
  const guard::RepeatWatch& repeat_watch() const { return watch_; }
  guard::RepeatWatch& repeat_watch() { return watch_; }

 private:
  const config::StabilityConfig* cfg_ = nullptr;
  const guard::Guard* guard_ = nullptr;
  const data::BatchSource* data_ = nullptr;
  Quarantine quarantine_;
  guard::RepeatWatch watch_;
};

}  // namespace keel::train
