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
  // Opens the files under run_dir for appending (a resumed run continues them) when `writer` is
  // true, else discards everything.
  static RunFiles open(const std::string& run_dir, bool writer, bool sample_ids = false);
};

}  // namespace keel::monitor
