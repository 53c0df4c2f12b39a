// The human-facing view of a run: a live, rewritten progress line on a terminal (step/total, loss,
// lr, tokens/s, ETA), and plain periodic log lines when stderr is not a terminal (CI, Slurm logs).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "config/schema.h"

namespace keel::monitor {

struct ProgressSample {
  int64_t step = 0, max_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, step_ms = 0;
  double loss_floor = -1;  // < 0: unknown
};

class Progress {
 public:
  // mode: auto (live line when stderr is a terminal), on, off (log lines only).
  Progress(config::Switch mode, bool enabled);
  void update(const ProgressSample& s);
  void finish();  // ends a live line so later log lines start clean

 private:
  bool live_ = false;
  bool enabled_ = true;
  bool dirty_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace keel::monitor
