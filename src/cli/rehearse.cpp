#include "cli/rehearse.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "common/event_kind.h"
#include "config/load.h"

namespace keel::cli {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kRehearsalSteps = 90;
constexpr int64_t kBadBatchStep = 40;  // after the warmup and the first stable snapshots
constexpr int64_t kLrSpikeStep = 65;   // after the first incident's recovery

int64_t count_of(const std::vector<nlohmann::json>& events, EventKind kind) {
  int64_t n = 0;
  for (const auto& e : events) n += e.value("kind", "") == name_of(kind);
  return n;
}

std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line, nullptr, false); !j.is_discarded()) out.push_back(j);
  return out;
}

// "the loss went from A before step `at` to at most B in the 5 steps after": what a fault did.
std::string loss_move(const std::vector<nlohmann::json>& metrics, int64_t at) {
  double before = -1, after = -1;
  for (const auto& m : metrics) {
    const int64_t step = m.value("step", int64_t{-1});
    const double loss = m.value("loss", -1.0);
    if (step == at - 1) before = loss;
    if (step >= at && step < at + 5) after = std::max(after, loss);
  }
  if (before <= 0 || after < 0) return "no loss logged around step " + std::to_string(at);
  return fmt::format("the loss went from {:.3f} to at most {:.3f} (x{:.2f})", before, after,
                     after / before);
}

}  // namespace

config::Config rehearsal_config(const config::Config& cfg) {
  config::Config c = cfg;
  c.production.locked = false;     // this copy only: the faults are the point of it
  c.production.validated.clear();  // one process here: its global batch is not the run's
  c.run.max_steps = kRehearsalSteps;
  c.schedule.warmup_steps = 10;
  c.checkpoint.every_steps = 10;
  c.checkpoint.dir.clear();
  c.checkpoint.async = false;
  c.eval.every_steps = 0;
  c.logging.every_steps = 1;  // the update-ratio and drift checks run at log steps
  c.logging.tensorboard = false;
  c.logging.progress = config::Switch::kOff;
  config::FaultSpec bad;
  bad.kind = config::FaultKind::kCorruptBatch;
  bad.mode = config::CorruptMode::kRandomTokens;
  bad.at_step = kBadBatchStep;
  bad.steps = 3;
  config::FaultSpec spike;
  spike.kind = config::FaultKind::kLrSpike;
  spike.factor = 100.0;
  spike.at_step = kLrSpikeStep;
  spike.steps = 2;
  c.faults = {bad, spike};
  return c;
}

Rehearsal rehearse(const config::Config& cfg) {
  const fs::path dir = fs::temp_directory_path() / ("keel-rehearse-" + std::to_string(::getpid()));
  std::error_code ec;
  checkpoint::remove_tree(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return {false, "cannot create " + dir.string() + ": " + ec.message()};
  const fs::path config_file = dir / "rehearsal.yaml", run_dir = dir / "run", log = dir / "log";
  checkpoint::write_new_file(config_file, config::to_yaml(rehearsal_config(cfg)));
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const std::string command =
      fmt::format("'{}' train '{}' --run-dir '{}' > '{}' 2>&1", self.string(), config_file.string(),
                  run_dir.string(), log.string());
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(command.c_str());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<nlohmann::json> events = read_jsonl(run_dir / "events.jsonl");
  const std::vector<nlohmann::json> metrics = read_jsonl(run_dir / "metrics.jsonl");
  std::string tail;
  {
    std::ifstream text(log);
    std::string line;
    while (std::getline(text, line)) tail = line;  // the run's last line: its error, if any
  }
  checkpoint::remove_tree(dir, ec);

  const int64_t pauses = count_of(events, EventKind::kPause),
                rollbacks = count_of(events, EventKind::kRollback),
                recovered = count_of(events, EventKind::kRecoveryEnd);
  const bool finished = status == 0 && count_of(events, EventKind::kRunEnd) == 1;
  Rehearsal r;
  r.passed = finished && pauses >= 1 && rollbacks >= 1 && recovered >= 1;
  const std::string injected = fmt::format(
      "{} steps of this config's model and data on this machine, a bad batch at step {} and an "
      "lr spike (x100) at step {}",
      kRehearsalSteps, kBadBatchStep, kLrSpikeStep);
  if (r.passed)
    r.what = fmt::format(
        "{}: {} pause(s), {} rollback(s) to a stable snapshot, {} recovery(ies) "
        "ended; the run finished ({:.0f} s, keel validate --rehearse)",
        injected, pauses, rollbacks, recovered, seconds);
  else if (!finished)
    r.what = fmt::format("{}: the run did not finish (exit status {}): {}", injected, status,
                         tail.empty() ? "no output" : tail);
  else
    r.what = fmt::format(
        "{}: {} pause(s), {} rollback(s), {} recovery(ies) ended, {} warn(s): the defences did not "
        "go through pause -> rollback -> recovery. At the bad batch {}; at the lr spike {} (a "
        "model that has learned little by then takes little harm from either: try a config that "
        "trains faster, or read the events)",
        injected, pauses, rollbacks, recovered, count_of(events, EventKind::kWarn),
        loss_move(metrics, kBadBatchStep), loss_move(metrics, kLrSpikeStep));
  return r;
}

}  // namespace keel::cli
