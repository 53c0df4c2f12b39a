// The remedies that move a run back, or past data: the rollback of a pause (to the newest stable
// snapshot, the data since it set aside, the recovery overlay started), the drop of an alarming
// step within an incident, and the recovery a resume starts (the newer timeline abandoned, its
// data set aside or replayed).
//
// Owns: no state between calls: what it moves (the counters, the data position, the model through
// `restore`) belongs to the collaborators it is given once (setup.cpp, from recovery_parts()).
// Called by: verdict.cpp (rollback() and drop_step() on the guard's verdict) and snapshot.cpp
// (record_resume: begin_resume() once after a resume restored a snapshot). Writes: through those
// collaborators: events (pause, rollback, recovery_start), quarantine.jsonl, forensics, the
// abandoned checkpoints. Saves: nothing. Collective with several ranks: every rank calls the same
// methods in the same order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpointer.h"
#include "checkpoint/tensor_file.h"
#include "common/event_kind.h"
#include "config/schema.h"
#include "data/batch.h"
#include "distributed/communicator.h"
#include "guard/guard.h"
#include "monitor/run_files.h"
#include "train/accumulation.h"
#include "train/counters.h"
#include "train/forensics.h"
#include "train/quarantine.h"
#include "train/run_history.h"
#include "train/step_values.h"
#include "train/trainer.h"

namespace keel::train {

struct RecoveryParts {
  const config::Config* cfg = nullptr;  // resolved: recovery.steps is a number
  distributed::Communicator* comm = nullptr;
  torch::Device device = torch::kCPU;
  checkpoint::Checkpointer* checkpointer = nullptr;
  data::BatchSource* train_data = nullptr;
  Quarantine* quarantine = nullptr;
  monitor::RunFiles* files = nullptr;
  TrainCounters* counters = nullptr;
  const Accumulation* accumulation = nullptr;  // micro-batches per step
  guard::Guard* guard = nullptr;               // null: stability.enabled is false
  const Forensics* forensics = nullptr;
  std::function<void(EventKind, const nlohmann::json&)> event;
  std::function<void(const guard::GuardEvent&)> guard_event;
  // Loads a snapshot's model and optimizer state (and, when asked, its data position), keeping
  // what must survive a rollback (the fp16 loss scale as the scaler has learned it).
  std::function<void(const checkpoint::CheckpointData&, bool restore_data)> restore;
  // The model's weights, for the forensics of an alarm.
  std::function<checkpoint::TensorMap()> weights;
  bool weights_in_parts = false;  // ZeRO-3: each rank holds its part
};

// What the step the guard acted on measured.
struct StepEvidence {
  const Verdict& verdict;      // with the samples as the host read them
  const StepSamples& samples;  // this rank's, on the device
};

class Recovery {
 public:
  explicit Recovery(RecoveryParts parts) : p_(std::move(parts)) {}

  // The guard paused: forensics, the newest stable snapshot restored, the data consumed since it
  // (and the incident's skip-ahead) set aside unless stability.rollback.skip_data is false, the
  // newer checkpoints abandoned, the record replayed from the snapshot's step, the overlay on.
  // RunStopped when there is no stable snapshot.
  void rollback(const StepEvidence& step);
  // Within an incident whose rollbacks are spent, or when the data set the alarm off: the update
  // was never applied; the step's kept samples go on record (the masked ones are already).
  void drop_step(const StepEvidence& step);
  // The schedule watch's back-off (guard/schedule_watch.h): the newest stable snapshot taken no
  // later than the last quiet reading restored (the newest one when none is that old) with its
  // data position: the model could not take its lr, the data was not at fault and is replayed;
  // the newer checkpoints abandoned, the record replayed from the snapshot's step, the lowered
  // peak in force. RunStopped when there is no stable snapshot.
  void back_off(const guard::Backoff& b);
  // Ranks whose copies of the weights should be equal were not (a device's memory or update went
  // wrong): every rank restores the newest checkpoint (saved when they agreed) with its data
  // position: the data was not at fault and is replayed; the newer checkpoints are abandoned and
  // the record replayed from its step. Returns its path; RunStopped when there is none.
  std::string restore_replicas();
  // A resume that is a recovery (from `snapshot`, just restored): the newest timeline after it
  // (its newest checkpoint, or `crash` if that got further) abandoned, its data set aside or
  // replayed as `data` says, and the recovery overlay started.
  void begin_resume(const std::filesystem::path& snapshot, const std::string& reason,
                    const std::optional<Heartbeat>& crash, ResumeData data);

 private:
  // Takes `micro_batches` from the data order without training on them, each sample on record in
  // quarantine.jsonl with `reason` (and its loss when `measured` holds it).
  void set_aside(int64_t micro_batches, const std::string& reason, const HostSamples& measured);
  void write_forensics(const StepEvidence& step) const;
  nlohmann::json skip_window(const nlohmann::json& data_at_snapshot, int64_t stable_micro,
                             int64_t skip_ahead_steps, const HostSamples& measured);

  RecoveryParts p_;
};

}  // namespace keel::train
