#include "monitor/run_files.h"

#include <stdio_ext.h>  // __fpurge
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace keel::monitor {

JsonlFile::JsonlFile(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw UserError("cannot open " + path + " for writing: " + std::strerror(errno));
}

JsonlFile::~JsonlFile() {
  if (file_) std::fclose(file_);
}

JsonlFile::JsonlFile(JsonlFile&& other) noexcept
    : file_(std::exchange(other.file_, nullptr)), path_(std::move(other.path_)) {}

JsonlFile& JsonlFile::operator=(JsonlFile&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    file_ = std::exchange(other.file_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

void JsonlFile::write(const JsonRecord& record) {
  if (!file_) return;
  std::string line = record.str();
  line += '\n';
  struct stat before {};
  const bool sized = ::fstat(::fileno(file_), &before) == 0;
  errno = 0;
  const bool written =
      std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  if (!written) {
    const std::string why = errno != 0 ? std::strerror(errno) : "short write";
    // No torn last line: drop what is still buffered (fclose would append it later) and cut the
    // file back to its last complete record (best effort).
    __fpurge(file_);
    if (sized) (void)!::ftruncate(::fileno(file_), before.st_size);
    std::clearerr(file_);
    throw RecordError("cannot write " + path_ + ": " + why);
  }
  // An open file outlives its directory: without this a deleted run directory would swallow the
  // record silently. One fstat per line is far below the cost of the line itself.
  struct stat st {};
  if (::fstat(::fileno(file_), &st) == 0 && st.st_nlink == 0)
    throw RecordError("cannot write " + path_ + ": the file was deleted (run directory removed?)");
}

void write_record_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw RecordError("cannot write " + path + ": " + std::strerror(errno));
  errno = 0;
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok)
    throw RecordError("cannot write " + path + ": " +
                      (err != 0 ? std::strerror(err) : "short write"));
}

RunFiles RunFiles::open(const std::string& run_dir, bool writer, bool sample_ids) {
  RunFiles files;
  if (writer) {
    files.metrics = JsonlFile(run_dir + "/metrics.jsonl");
    files.events = JsonlFile(run_dir + "/events.jsonl");
    files.eval = JsonlFile(run_dir + "/eval.jsonl");
    files.quarantine = JsonlFile(run_dir + "/quarantine.jsonl");
    if (sample_ids) files.samples = JsonlFile(run_dir + "/samples.jsonl");
  }
  return files;
}

}  // namespace keel::monitor
