// RUN_DIR/quarantine.jsonl: every sample set aside (the screen's masked ones, the data a rollback
// or a recovering resume skips, the steps an incident dropped), once, with why and where it is in
// the data, so that a person can clean the source.
//
// Owns: the record and the ids on it since the newest stable snapshot: a rollback re-reads the
// data from that snapshot and must not record a sample twice. Called by: setup.cpp (opened with
// the record), screen.cpp (quarantine_masked: the screen's masked, repeated and low samples),
// recovery.cpp (record: a rollback's window, a dropped step, a recovering resume's skipped data)
// and snapshot.cpp (stable_snapshot_taken() when a snapshot becomes stable: no rollback goes back
// past it). Writes: quarantine.jsonl only (rank 0's file; other ranks' discard). Saves: nothing: a
// start begins with no ids, so after a resume a rollback to a stable snapshot older than the
// resume can put a sample on record a second time. One per trainer, one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/batch.h"
#include "monitor/run_files.h"
#include "train/counters.h"

namespace keel::train {

class Quarantine {
 public:
  // `file` and `data` outlive this object; `data` says where a sample id is (shard, offset).
  Quarantine(monitor::JsonlFile& file, const data::BatchSource& data)
      : file_(&file), data_(&data) {}
  Quarantine() = default;  // records nothing until assigned

  // One record: the sample, the step and iteration `at`, why, its loss when measured, where it is
  // in the data, and `extra` fields. Nothing when the sample is on record since the newest stable
  // snapshot.
  void record(int64_t id, const TrainCounters& at, const std::string& reason,
              std::optional<double> loss, const nlohmann::json& extra = nlohmann::json::object());
  // The screen's masked samples of a step (id, loss), each on record, worst first; returns the
  // worst `top_k` as [{id, loss}] for the step's screen events.
  nlohmann::json record_screened(std::vector<std::pair<double, int64_t>> masked,
                                 const TrainCounters& at, int64_t top_k);
  void stable_snapshot_taken() { since_stable_.clear(); }

 private:
  monitor::JsonlFile* file_ = nullptr;
  const data::BatchSource* data_ = nullptr;
  std::unordered_set<int64_t> since_stable_;
};

}  // namespace keel::train
