#include "train/run_history.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

namespace keel::train {
namespace {

std::optional<Heartbeat> read_heartbeat(const std::string& path) {
  std::ifstream in(path);
  Heartbeat h;
  if (in >> h.step >> h.iteration >> h.micro_taken) return h;
  return std::nullopt;
}

// The abnormal ends recorded in starts.jsonl, and whether its last line is a start with no end.
std::vector<Heartbeat> recorded_abnormal_ends(const std::string& log_path, bool& open_start) {
  std::vector<Heartbeat> out;
  open_start = false;
  std::ifstream in(log_path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("event")) continue;
    const std::string event = j["event"].get<std::string>();
    open_start = event == "start";
    if (event == "abnormal_end")
      out.push_back({j.value("step", int64_t{0}), j.value("iteration", int64_t{0}),
                     j.value("micro_taken", int64_t{0})});
  }
  return out;
}

}  // namespace

std::vector<Heartbeat> read_abnormal_ends(const std::string& run_dir) {
  bool open_start = false;
  auto ends = recorded_abnormal_ends(run_dir + "/starts.jsonl", open_start);
  if (open_start) ends.push_back(read_heartbeat(run_dir + "/heartbeat").value_or(Heartbeat{}));
  return ends;
}

std::optional<Heartbeat> crash_loop_after(const std::vector<Heartbeat>& ends,
                                          int64_t checkpoint_step) {
  std::map<int64_t, int> deaths;
  // Only deaths after progress past the checkpoint: a process killed twice before it finished a
  // step (a slow start, a scheduler's kill) is not a crash loop.
  for (const auto& h : ends)
    if (h.step > checkpoint_step && ++deaths[h.step] >= 2) return h;
  return std::nullopt;
}

RunHistory::RunHistory(const std::string& run_dir, const std::string& resume) {
  const std::string log_path = run_dir + "/starts.jsonl";
  const std::string heartbeat_path = run_dir + "/heartbeat";
  bool open_start = false;  // the last line is a start with no end after it
  abnormal_ = recorded_abnormal_ends(log_path, open_start);
  log_ = monitor::JsonlFile(log_path);
  if (open_start) {
    const Heartbeat h = read_heartbeat(heartbeat_path).value_or(Heartbeat{});
    abnormal_.push_back(h);
    log_.write(monitor::JsonRecord()
                   .add("event", "abnormal_end")
                   .add("step", h.step)
                   .add("iteration", h.iteration)
                   .add("micro_taken", h.micro_taken));
  }
  log_.write(monitor::JsonRecord()
                 .add("event", "start")
                 .add("unix_time", static_cast<int64_t>(std::time(nullptr)))
                 .add("pid", static_cast<int64_t>(::getpid()))
                 .add("resume", resume));
  heartbeat_fd_ = ::open(heartbeat_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
}

RunHistory::~RunHistory() {
  if (heartbeat_fd_ >= 0) ::close(heartbeat_fd_);
}

RunHistory::RunHistory(RunHistory&& o) noexcept
    : log_(std::move(o.log_)),
      heartbeat_fd_(std::exchange(o.heartbeat_fd_, -1)),
      abnormal_(std::move(o.abnormal_)) {}

RunHistory& RunHistory::operator=(RunHistory&& o) noexcept {
  if (this != &o) {
    if (heartbeat_fd_ >= 0) ::close(heartbeat_fd_);
    log_ = std::move(o.log_);
    heartbeat_fd_ = std::exchange(o.heartbeat_fd_, -1);
    abnormal_ = std::move(o.abnormal_);
  }
  return *this;
}

std::optional<Heartbeat> RunHistory::crash_loop_after(int64_t checkpoint_step) const {
  return train::crash_loop_after(abnormal_, checkpoint_step);
}

void RunHistory::beat(const Heartbeat& h) {
  if (heartbeat_fd_ < 0) return;
  char buf[96];
  // Fixed width, so a shorter line never leaves the tail of a longer one behind.
  const int n =
      std::snprintf(buf, sizeof buf, "%20lld %20lld %20lld\n", static_cast<long long>(h.step),
                    static_cast<long long>(h.iteration), static_cast<long long>(h.micro_taken));
  // Best effort: a lost heartbeat only makes crash-loop detection later, never wrong.
  (void)!::pwrite(heartbeat_fd_, buf, static_cast<size_t>(n), 0);
}

void RunHistory::record_end(int exit_code, int64_t step) {
  log_.write(monitor::JsonRecord()
                 .add("event", "end")
                 .add("exit", exit_code)
                 .add("step", step)
                 .add("unix_time", static_cast<int64_t>(std::time(nullptr))));
}

}  // namespace keel::train
