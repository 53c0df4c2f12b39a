// The human-facing view of a long command: a live, rewritten progress line on a terminal, and plain
// periodic log lines when stderr is not a terminal (CI, Slurm logs). `keel train` shows step/total,
// loss, lr, tokens/s, tokens seen and ETA; `keel prepare` shows its pass, documents, bytes, tokens
// and ETA (cli/prepare_command.cpp formats that line).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "config/schema.h"

namespace keel::monitor {

struct ProgressSample {
  int64_t step = 0, max_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, step_ms = 0;
  double loss_floor = -1;  // < 0: unknown
  int64_t tokens_seen = 0;
};

class Progress {
 public:
  // mode: auto (live line when stderr is a terminal), on, off (log lines only).
  Progress(config::Switch mode, bool enabled);
  void update(const ProgressSample& s);
  // Any line: rewritten in place on a terminal; otherwise logged under `component` when `log` is
  // true (the caller decides how often a log gets a line).
  void show(const std::string& component, const std::string& line, bool log = true);
  void finish();  // ends a live line so later log lines start clean
  bool live() const { return live_; }

 private:
  bool live_ = false;
  bool enabled_ = true;
  bool dirty_ = false;
  // The first step this process showed, and when: the ETA is the pace since then, so a resumed
  // run's ETA is not diluted by the steps an earlier process trained.
  std::optional<std::pair<int64_t, std::chrono::steady_clock::time_point>> first_;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"
std::string format_count(double n);           // "950", "12.3k", "4.56M", "7.89G"

}  // namespace keel::monitor
