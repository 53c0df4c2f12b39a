// stability.update_gate: under `device` (the default) the update is queued at once, gated on the
// device by the guard's pause levels, and the host reads the step while the device updates;
// under `host` the update waits for the host's read and decision. On scenarios that exercise
// every refusal — corrupt batches, lr spikes, NaN gradients, ten incidents in one run — the two
// must be one and the same run: the same refused steps, rollbacks, snapshots, data and losses,
// bit for bit. A gate that applied an update the guard refuses stops the run as a bug.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "harness.h"

namespace keel::testing {
namespace {

struct Scenario {
  std::string name;
  std::string args;                         // besides the smaller model and the gate
  std::map<std::string, int> least_events;  // what shows the scenario refused updates
};

void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

// A smaller model than the embedded default's, so that both runs fit in the suite's time. The
// checkpoint cadence is fixed: `auto` measures the machine's speed, which differs run to run.
std::string gate_run(const ScratchDir& d, const Scenario& s, const std::string& gate) {
  return "train --run-dir " + d.str() +
         " --set model.d_model=64 --set model.seq_len=64 --set data.micro_batch_size=8"
         " --set checkpoint.every_steps=16"
         " --set logging.progress=off --set logging.sample_ids=true --set stability.update_gate=" +
         gate + " " + s.args;
}

std::vector<nlohmann::json> guard_record(const ScratchDir& d) {
  // What the guard decided and what followed from it; checkpoint and memory events carry
  // timings, so only their step stands for them.
  static const std::set<std::string> timed = {
      "checkpoint", "memory", "run_end", "run_start", "stable_snapshot", "checkpoint_cadence"};
  std::vector<nlohmann::json> out;
  for (auto e : read_jsonl(d.path() / "events.jsonl")) {
    if (timed.count(e["kind"].get<std::string>())) e.erase("detail");
    if (e.contains("detail")) {  // times
      e["detail"].erase("replay_s");
      e["detail"].erase("restore_s");
    }
    std::string text = e.dump();  // paths inside the run directory, without it
    for (size_t at; (at = text.find(d.str())) != std::string::npos;)
      text.replace(at, d.str().size(), "RUN_DIR");
    out.push_back(nlohmann::json::parse(text));
  }
  return out;
}

std::string file_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class UpdateGate : public ::testing::TestWithParam<Scenario> {};

TEST_P(UpdateGate, TheDeviceGateRefusesExactlyWhatTheHostGuardRefuses) {
  const Scenario& s = GetParam();
  ScratchDir device_gate("gate_device_" + s.name), host_gate("gate_host_" + s.name);
  auto a = run_keel(gate_run(device_gate, s, "device"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b = run_keel(gate_run(host_gate, s, "host"));
  ASSERT_EQ(b.exit_code, 0) << b.output;

  // The scenario refused updates, so the comparison below means something.
  std::map<std::string, int> kinds;
  for (const auto& e : read_jsonl(device_gate.path() / "events.jsonl"))
    ++kinds[e["kind"].get<std::string>()];
  for (const auto& [kind, least] : s.least_events) EXPECT_GE(kinds[kind], least) << kind;

  const auto events_a = guard_record(device_gate), events_b = guard_record(host_gate);
  ASSERT_EQ(events_a.size(), events_b.size());
  for (size_t i = 0; i < events_a.size(); ++i) EXPECT_EQ(events_a[i], events_b[i]) << "event " << i;
  for (const char* file : {"metrics.jsonl", "eval.jsonl", "quarantine.jsonl", "samples.jsonl"}) {
    const auto ra = read_jsonl(device_gate.path() / file);
    const auto rb = read_jsonl(host_gate.path() / file);
    ASSERT_EQ(ra.size(), rb.size()) << file;
    for (size_t i = 0; i < ra.size(); ++i) {
      auto x = ra[i], y = rb[i];
      for (auto* r : {&x, &y})  // the throughput figures are the wall clock's
        for (const char* k : {"tokens_per_s", "loader_wait_ms", "step_ms", "comm_ms", "guard_ms",
                              "queue_depth", "mfu"})
          r->erase(k);
      EXPECT_EQ(x, y) << file << " line " << i + 1;
    }
  }
  for (const char* pointer : {"checkpoints/LATEST", "checkpoints/STABLE"})
    EXPECT_EQ(file_text(device_gate.path() / pointer), file_text(host_gate.path() / pointer));
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, UpdateGate,
    ::testing::Values(
        Scenario{"corrupt_batch",
                 "--set run.max_steps=160 --set 'faults=[{kind: corrupt_batch, mode: "
                 "random_tokens, at_step: 80, steps: 40}]'",
                 {{"pause", 5}}},
        Scenario{"lr_spike",
                 "--set run.max_steps=100 --set 'faults=[{kind: lr_spike, factor: 100, at_step: "
                 "60, steps: 2}]'",
                 {{"pause", 1}, {"rollback", 1}}},
        Scenario{"nan",
                 "--set run.max_steps=60 --set 'faults=[{kind: nan_grad, at_step: 30}]'",
                 {{"skip_nan", 1}}},
        Scenario{"ten_incidents",
                 "--set run.max_steps=300" + kTenIncidentFaults,
                 {{"skip_nan", 1}, {"pause", 2}, {"rollback", 1}, {"screen", 1}}},
        // fp16: the scaler's overflows, and its flag and scale read with the step.
        Scenario{"fp16_overflows",
                 "--set run.max_steps=30 --set run.precision=fp16 --set "
                 "run.fp16_initial_scale=4.0e9 --set model.seq_len=32 --set "
                 "schedule.warmup_steps=2",
                 {{"overflow", 5}}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace keel::testing
