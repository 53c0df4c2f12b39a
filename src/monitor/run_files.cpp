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

RunFiles RunFiles::open(const std::string& run_dir, bool writer, bool sample_ids,
                        int64_t tensorboard_every) {
  RunFiles files;
  if (writer) {
    if (tensorboard_every > 0) {
      files.tensorboard = TensorBoardWriter(run_dir + "/tensorboard");
      files.tensorboard_every = tensorboard_every;
    }
    files.metrics = JsonlFile(run_dir + "/metrics.jsonl");
    files.events = JsonlFile(run_dir + "/events.jsonl");
    files.eval = JsonlFile(run_dir + "/eval.jsonl");
    files.quarantine = JsonlFile(run_dir + "/quarantine.jsonl");
    if (sample_ids) files.samples = JsonlFile(run_dir + "/samples.jsonl");
  }
  return files;
}

namespace {

// Every number in `value` as a scalar under `tag` (objects descend: tag/key).
void add_scalars(TensorBoardWriter& tb, const std::string& tag, int64_t step,
                 const nlohmann::json& value) {
  if (value.is_number()) {
    tb.add_scalar(tag, step, value.get<double>());
  } else if (value.is_boolean()) {
    tb.add_scalar(tag, step, value.get<bool>() ? 1.0 : 0.0);
  } else if (value.is_object()) {
    for (const auto& [key, inner] : value.items()) add_scalars(tb, tag + "/" + key, step, inner);
  }
}

void mirror_scalars(TensorBoardWriter& tb, const std::string& prefix, int64_t step,
                    const JsonRecord& record) {
  // The record's own text, parsed back: TensorBoard shows exactly the numbers the JSONL holds.
  // Held in a local: a range-for over items() of a temporary dangles (before C++23).
  const auto parsed = nlohmann::json::parse(record.str());
  for (const auto& [key, value] : parsed.items())
    if (key != "step") add_scalars(tb, prefix + key, step, value);
  tb.flush();
}

}  // namespace

void RunFiles::write_metrics(int64_t step, const JsonRecord& record) {
  metrics.write(record);
  if (tensorboard_every > 0 && step % tensorboard_every == 0)
    mirror_scalars(tensorboard, "train/", step, record);
}

void RunFiles::write_eval(int64_t step, const JsonRecord& record) {
  eval.write(record);
  if (tensorboard_every > 0) mirror_scalars(tensorboard, "val/", step, record);
}

void RunFiles::write_event(int64_t step, const std::string& kind, const JsonRecord& record) {
  events.write(record);
  if (tensorboard_every == 0) return;
  const auto j = nlohmann::json::parse(record.str());
  const nlohmann::json detail = j.value("detail", nlohmann::json::object());
  std::string text = "**" + kind + "** at step " + std::to_string(step);
  if (detail.contains("message") && detail["message"].is_string())
    text += ": " + detail["message"].get<std::string>();
  // Indented four spaces: Markdown shows it verbatim.
  text += "\n\n    " + detail.dump();
  tensorboard.add_text("events/" + kind, step, text);
  tensorboard.flush();
}

void RunFiles::replay_from(int64_t step) {
  if (tensorboard_every == 0) return;
  tensorboard.restart_at(step);
  tensorboard.flush();
}

}  // namespace keel::monitor
