#include "cli/rehearse.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "common/event_kind.h"
#include "config/load.h"
#include "guard/schedule_watch.h"

namespace keel::cli {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kRehearsalSteps = 90;
constexpr int64_t kWrongDeviceStep = 30;  // one wrong gradient, the data clean: a machine fault
constexpr int64_t kBadBatchStep = 40;     // after the warmup and the first stable snapshots
constexpr int64_t kLrSpikeStep = 65;      // after the first incident's recovery
constexpr int64_t kRehearsalWarmup = 10;
// A probe: the warmup and three times as long at the peak. Measured on tiny: 10x its lr passes
// the alarm level by step 3, 3x on real text by 1.5 warmups (schedule_watch.h).
constexpr int64_t kProbeSteps = 4 * kRehearsalWarmup;
// Half-decade multiples of the peak, as the back-off steps down: up to 100x.
constexpr double kProbeMultiples[] = {3.1622776601683795, 10.0, 31.622776601683793, 100.0};

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

// One `keel train` of a config in a scratch directory (removed after): what it left.
struct RunOutcome {
  int status = -1;  // the exit code; -1 when a signal ended it (see signal)
  int signal = 0;
  double seconds = 0.0;
  std::vector<nlohmann::json> events, metrics;
  std::string last_line;  // the run's last line of output: its error, if any
  std::string error;      // the scratch directory could not be made
};

RunOutcome run_train(const config::Config& c, const std::string& name) {
  RunOutcome out;
  const fs::path dir = fs::temp_directory_path() / fmt::format("keel-{}-{}", name, ::getpid());
  std::error_code ec;
  checkpoint::remove_tree(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) {
    out.error = "cannot create " + dir.string() + ": " + ec.message();
    return out;
  }
  const fs::path config_file = dir / "rehearsal.yaml", run_dir = dir / "run", log = dir / "log";
  checkpoint::write_new_file(config_file, config::to_yaml(c));
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const std::string command =
      fmt::format("'{}' train '{}' --run-dir '{}' > '{}' 2>&1", self.string(), config_file.string(),
                  run_dir.string(), log.string());
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(command.c_str());
  if (status != -1 && WIFEXITED(status))
    out.status = WEXITSTATUS(status);
  else if (status != -1 && WIFSIGNALED(status))
    out.signal = WTERMSIG(status);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.events = read_jsonl(run_dir / "events.jsonl");
  out.metrics = read_jsonl(run_dir / "metrics.jsonl");
  std::ifstream text(log);
  for (std::string line; std::getline(text, line);) out.last_line = line;
  checkpoint::remove_tree(dir, ec);
  return out;
}

// The largest attention growth the metrics show before step `before` (-1: none logged).
double max_growth(const std::vector<nlohmann::json>& metrics, int64_t before) {
  double g = -1.0;
  for (const auto& m : metrics)
    if (m.value("step", int64_t{0}) < before && m.contains("attn_growth"))
      g = std::max(g, m["attn_growth"].get<double>());
  return g;
}

// The schedule's part: the growth at the configured peak in the rehearsal's own steps before its
// first fault, then probes up the half-decades until one would back off.
void judge_lr(const config::Config& cfg, const RunOutcome& rehearsal, Rehearsal& r) {
  const double peak = cfg.optim.lr;
  const double growth = max_growth(rehearsal.metrics, kBadBatchStep);
  std::vector<const nlohmann::json*> backoffs;
  for (const auto& e : rehearsal.events)
    if (e.value("kind", "") == name_of(EventKind::kScheduleBackoff)) backoffs.push_back(&e);
  if (!backoffs.empty()) {
    const auto& last = (*backoffs.back())["detail"];
    r.lr_quiet = false;
    r.lr_what = fmt::format(
        "optim.lr {:.3g} is too high for this model: in the rehearsal the attention output grew "
        "past {:.0f}x its value at initialisation and the guard backed the schedule off {} "
        "time(s), to a peak of {:.3g}. HINT: set optim.lr to {:.3g} (a run would lose the steps "
        "before each back-off)",
        peak, guard::kGrowthAlarm, backoffs.size(), last.value("to_lr", 0.0),
        last.value("to_lr", 0.0));
    return;
  }
  if (growth < 0) {
    r.lr_what = fmt::format(
        "not measured: the rehearsal logged no attention growth ({})",
        !cfg.stability.enabled ? "stability.enabled is false: the guard's watch is off"
        : rehearsal.metrics.empty()
            ? "the rehearsal run logged no step: " +
                  (rehearsal.last_line.empty() ? std::string("no output") : rehearsal.last_line)
            : "the model reports no attention statistics");
    return;
  }
  r.lr_quiet = growth < guard::kGrowthWarn;
  std::string at_peak = fmt::format(
      "at the configured peak {:.3g} the attention output grew at most {:.1f}x its value at "
      "initialisation in the rehearsal's {}-step warmup and the {} steps after ({}: warns at "
      "{:.0f}x, backs off at {:.0f}x)",
      peak, growth, kRehearsalWarmup, kBadBatchStep - 1 - kRehearsalWarmup,
      r.lr_quiet ? "quiet" : "past the warn level", guard::kGrowthWarn, guard::kGrowthAlarm);
  for (const double multiple : kProbeMultiples) {
    const RunOutcome probe = run_train(probe_config(cfg, multiple), "lr-probe");
    if (probe.signal != 0 || probe.status == 130 || !probe.error.empty()) {
      // Interrupted (Ctrl-C reaches the probe, not us): what was not measured is not quiet.
      r.lr_what = fmt::format(
          "{}; the probe at {:.3g}x the peak did not finish ({}): the peak at "
          "which it would not stay quiet was not measured",
          at_peak, multiple,
          !probe.error.empty() ? probe.error
          : probe.signal != 0  ? fmt::format("signal {}", probe.signal)
                               : std::string("interrupted"));
      return;
    }
    bool backed_off = false;
    for (const auto& e : probe.events)
      backed_off |= e.value("kind", "") == name_of(EventKind::kScheduleBackoff);
    const double g = max_growth(probe.metrics, kProbeSteps + 1);
    if (backed_off || g >= guard::kGrowthAlarm) {
      r.lr_what = fmt::format(
          "{}; it would not stay quiet at {:.3g} ({:.3g}x the peak: {}{:.0f}x within {} steps, "
          "where the guard backs the schedule off)",
          at_peak, peak * multiple, multiple, g >= guard::kGrowthAlarm ? "" : "past ",
          std::max(g, guard::kGrowthAlarm), kProbeSteps);
      return;
    }
  }
  r.lr_what = fmt::format("{}; it stayed below the back-off level up to {:.0f}x the peak", at_peak,
                          kProbeMultiples[std::size(kProbeMultiples) - 1]);
}

}  // namespace

config::Config rehearsal_config(const config::Config& cfg) {
  config::Config c = cfg;
  c.production.locked = false;     // this copy only: the faults are the point of it
  c.production.validated.clear();  // one process here: its global batch is not the run's
  c.run.max_steps = kRehearsalSteps;
  c.schedule.warmup_steps = kRehearsalWarmup;
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
  config::FaultSpec wrong;  // a device's wrong result once: the replay must tell it from the data
  wrong.kind = config::FaultKind::kCorruptGrad;
  wrong.at_step = kWrongDeviceStep;
  c.faults = {wrong, bad, spike};
  return c;
}

config::Config probe_config(const config::Config& cfg, double lr_multiple) {
  config::Config c = rehearsal_config(cfg);
  c.run.max_steps = kProbeSteps;
  c.optim.lr = cfg.optim.lr * lr_multiple;
  c.stability.enabled = true;  // the watch measures; nothing else of the guard matters here
  c.faults.clear();
  return c;
}

Rehearsal rehearse(const config::Config& cfg) {
  const RunOutcome run = run_train(rehearsal_config(cfg), "rehearse");
  if (!run.error.empty()) return {false, run.error, false, "not measured: " + run.error};
  const auto& events = run.events;
  const int64_t pauses = count_of(events, EventKind::kPause),
                rollbacks = count_of(events, EventKind::kRollback),
                recovered = count_of(events, EventKind::kRecoveryEnd),
                machine = count_of(events, EventKind::kHardwareFault);
  const bool finished = run.status == 0 && count_of(events, EventKind::kRunEnd) == 1;
  Rehearsal r;
  r.passed = finished && pauses >= 1 && rollbacks >= 1 && recovered >= 1 && machine == 1;
  const std::string injected = fmt::format(
      "{} steps of this config's model and data on this machine, a device's wrong gradient at "
      "step {}, a bad batch at step {} and an lr spike (x100) at step {}",
      kRehearsalSteps, kWrongDeviceStep, kBadBatchStep, kLrSpikeStep);
  if (r.passed)
    r.what = fmt::format(
        "{}: the wrong gradient named as a machine fault, {} pause(s), {} rollback(s) to a stable "
        "snapshot, {} recovery(ies) ended; the run finished ({:.0f} s, keel validate --rehearse)",
        injected, pauses, rollbacks, recovered, run.seconds);
  else if (!finished)
    r.what = fmt::format("{}: the run did not finish ({}): {}", injected,
                         run.signal != 0 ? fmt::format("signal {}", run.signal)
                                         : fmt::format("exit code {}", run.status),
                         run.last_line.empty() ? "no output" : run.last_line);
  else if (pauses >= 1 && rollbacks >= 1 && recovered >= 1)
    r.what = fmt::format(
        "{}: {} machine fault(s) named where one was injected: the replay of an alarm's step {} "
        "(the run's log says whether its first step computed again matched)",
        injected, machine,
        machine == 0 ? "did not tell the device from the data" : "blamed the machine too often");
  else
    r.what = fmt::format(
        "{}: {} pause(s), {} rollback(s), {} recovery(ies) ended, {} warn(s): the defences did not "
        "go through pause -> rollback -> recovery. At the bad batch {}; at the lr spike {} (a "
        "model that has learned little by then takes little harm from either: try a config that "
        "trains faster, or read the events)",
        injected, pauses, rollbacks, recovered, count_of(events, EventKind::kWarn),
        loss_move(run.metrics, kBadBatchStep), loss_move(run.metrics, kLrSpikeStep));
  if (const int64_t backoffs = count_of(events, EventKind::kScheduleBackoff);
      !r.passed && backoffs > 0)
    r.what += fmt::format(
        " (the schedule backed off {} time(s) first, so the faults met a model restarted on a "
        "lowered peak: rehearse again at the lr named below)",
        backoffs);
  judge_lr(cfg, run, r);
  return r;
}

}  // namespace keel::cli
