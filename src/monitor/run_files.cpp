#include "monitor/run_files.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace keel::monitor {

JsonlFile::JsonlFile(const std::string& path) {
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw UserError("cannot open " + path + " for writing: " + std::strerror(errno));
}

JsonlFile::~JsonlFile() {
  if (file_) std::fclose(file_);
}

JsonlFile::JsonlFile(JsonlFile&& other) noexcept : file_(std::exchange(other.file_, nullptr)) {}

JsonlFile& JsonlFile::operator=(JsonlFile&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    file_ = std::exchange(other.file_, nullptr);
  }
  return *this;
}

void JsonlFile::write(const JsonRecord& record) {
  if (!file_) return;
  std::string line = record.str();
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

RunFiles RunFiles::open(const std::string& run_dir, bool writer, bool sample_ids) {
  RunFiles files;
  if (writer) {
    files.metrics = JsonlFile(run_dir + "/metrics.jsonl");
    files.events = JsonlFile(run_dir + "/events.jsonl");
    files.eval = JsonlFile(run_dir + "/eval.jsonl");
    if (sample_ids) files.samples = JsonlFile(run_dir + "/samples.jsonl");
  }
  return files;
}

}  // namespace keel::monitor
