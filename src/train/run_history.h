// The run directory's start/end log, RUN_DIR/starts.jsonl, and its heartbeat, RUN_DIR/heartbeat:
// what a restarting launcher (torchrun --max-restarts, Slurm requeue, a shell loop) needs to tell a
// crash loop from progress. Every start appends a `start` line; a run that ends through keel's own
// exit paths appends an `end` line; a start that finds the previous start without an end records
// that one as an `abnormal_end` at the position its heartbeat last reported.
//
// Owns: starts.jsonl and the heartbeat open for writing, and the abnormal ends on record. Called
// by: setup.cpp (open_record: rank 0 makes it), trainer.cpp (loop: beat() at the start and after
// every step attempt; run: record_end() as it ends), resume_source.cpp and cli/resume_plan.cpp
// (read_abnormal_ends, crash_loop_after). Writes: starts.jsonl and heartbeat, rank 0 only. Saves:
// nothing: the run directory is its state, read back at each start. Not thread-safe: the trainer
// thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "monitor/run_files.h"

namespace keel::train {

// Where a run was when it last reported: after `step` updates, `iteration` attempts and
// `micro_taken` micro-batches.
struct Heartbeat {
  int64_t step = 0, iteration = 0, micro_taken = 0;
};

// The abnormal ends on record in RUN_DIR/starts.jsonl, oldest first, counting a last start that
// has no end (a run killed, or one still running) as ended at the heartbeat. Reads only.
std::vector<Heartbeat> read_abnormal_ends(const std::string& run_dir);
// When at least two of `ends` died at the same step after `checkpoint_step` (having made progress
// past it): that position.
std::optional<Heartbeat> crash_loop_after(const std::vector<Heartbeat>& ends,
                                          int64_t checkpoint_step);

class RunHistory {
 public:
  RunHistory() = default;  // discards (ranks other than 0)
  // Reads RUN_DIR/starts.jsonl and the heartbeat, records the previous start's abnormal end if it
  // had one, then appends this start.
  RunHistory(const std::string& run_dir, const std::string& resume);
  ~RunHistory();
  RunHistory(const RunHistory&) = delete;
  RunHistory& operator=(const RunHistory&) = delete;
  RunHistory(RunHistory&&) noexcept;
  RunHistory& operator=(RunHistory&&) noexcept;

  // The heartbeats of the abnormal ends on record, oldest first.
  const std::vector<Heartbeat>& abnormal_ends() const { return abnormal_; }
  // See the free function crash_loop_after.
  std::optional<Heartbeat> crash_loop_after(int64_t checkpoint_step) const;

  void beat(const Heartbeat& h);  // overwrites RUN_DIR/heartbeat in place (one pwrite)
  void record_end(int exit_code, int64_t step);

 private:
  monitor::JsonlFile log_;
  int heartbeat_fd_ = -1;
  std::vector<Heartbeat> abnormal_;
};

}  // namespace keel::train
