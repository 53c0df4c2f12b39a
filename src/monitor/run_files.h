// The run directory's append-only record files (metrics.jsonl, events.jsonl, eval.jsonl and the
// optional samples.jsonl).
// Only rank 0 writes; other ranks get a RunFiles that discards. Each line is flushed as written so
// a crashed run leaves complete lines behind, and checked: a short write (a full disk) or a file
// whose directory vanished throws RecordError naming the file — a run never trains on without a
// record. Not thread-safe: the trainer thread owns it.
#pragma once

#include <cstdio>
#include <string>

#include "monitor/json_record.h"
#include "monitor/tensorboard.h"

namespace keel::monitor {

class JsonlFile {
 public:
  JsonlFile() = default;  // discards
  explicit JsonlFile(const std::string& path);
  ~JsonlFile();
  JsonlFile(const JsonlFile&) = delete;
  JsonlFile& operator=(const JsonlFile&) = delete;
  JsonlFile(JsonlFile&& other) noexcept;
  JsonlFile& operator=(JsonlFile&& other) noexcept;
  void write(const JsonRecord& record);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// Writes `text` to `path` (replacing it) and checks every step; RecordError names the file.
void write_record_file(const std::string& path, const std::string& text);

struct RunFiles {
  JsonlFile metrics, events, eval;
  JsonlFile samples;     // samples.jsonl, only when asked for (logging.sample_ids)
  JsonlFile quarantine;  // quarantine.jsonl: every sample set aside, with why
  // RUN_DIR/tensorboard/, only when asked for (logging.tensorboard): the same records as
  // metrics.jsonl (every tensorboard_every steps), eval.jsonl and events.jsonl.
  TensorBoardWriter tensorboard;
  int64_t tensorboard_every = 0;

  // Opens the files under run_dir for appending (a resumed run continues them) when `writer` is
  // true, else discards everything. tensorboard_every > 0 also starts an events file.
  static RunFiles open(const std::string& run_dir, bool writer, bool sample_ids = false,
                       int64_t tensorboard_every = 0);

  // One line of metrics.jsonl. On the TensorBoard cadence its numbers also become scalars
  // train/<key> (nested objects train/<key>/<name>; booleans 0/1).
  void write_metrics(int64_t step, const JsonRecord& record);
  // One line of eval.jsonl; in TensorBoard val/<key>.
  void write_eval(int64_t step, const JsonRecord& record);
  // One line of events.jsonl; in TensorBoard a text under events/<kind>: the message when the
  // event has one, and its detail as JSON.
  void write_event(int64_t step, const std::string& kind, const JsonRecord& record);
  // Steps from `step` on are about to be trained again (a resume or a rollback): TensorBoard
  // drops what it holds for them (TensorBoardWriter::restart_at).
  void replay_from(int64_t step);
};

}  // namespace keel::monitor
