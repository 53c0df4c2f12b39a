// Where a start resumes from, found and checked before the start writes anything (issue 32: a
// refused start leaves the run directory as it was). Reads only; every refusal is a UserError
// (exit 2) whose message names the checkpoint and what is wrong.
//
// Owns: the checkpoint a start resumes from, read and verified, and how it was found, until the
// start has restored it. Called by: setup.cpp (build(): find_resume_source, check_resumable, then
// the restore; on every rank, before its first write) and snapshot.cpp (record_resume, which puts
// it on record and drops it). Writes: nothing. Saves: nothing.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "checkpoint/checkpointer.h"
#include "config/schema.h"
#include "train/run_history.h"
#include "train/trainer.h"

namespace keel::train {

struct ResumeSource {
  std::filesystem::path path;       // the checkpoint directory
  checkpoint::CheckpointData data;  // read and verified once
  // The pointer it was found by (after a crash loop: stable); nullopt for a path the user gave.
  std::optional<checkpoint::Pointer> pointer;
  std::string mode;  // as the record names it: latest | stable | the path given
  // A restart loop that met the same crash twice since the newest checkpoint: `latest` became a
  // recovery from the newest stable snapshot, and this is where the run died.
  std::optional<Heartbeat> crash;
};

// The checkpoint `request` names in `checkpoints_dir`, read and verified for this rank. nullopt
// when nothing is to be resumed: no --resume, or latest/stable with no checkpoint yet (a restart
// loop may always pass `--resume latest`). `run_dir` holds starts.jsonl (the crash-loop check).
std::optional<ResumeSource> find_resume_source(const std::filesystem::path& checkpoints_dir,
                                               const std::string& run_dir,
                                               const ResumeRequest& request, int rank,
                                               int world_size);

// CheckpointError, naming every key, when `cfg` changes what a resume cannot honour: the model's
// shape, the identity of the data stream (source, path, seed), or the optimizer state's sharding
// (distributed.zero). The micro-batch size may change: the data position and the counters are
// mapped onto the new layout, and a layout they do not map onto evenly is refused when restored.
void check_resumable(const config::Config& cfg, const ResumeSource& source);

}  // namespace keel::train
