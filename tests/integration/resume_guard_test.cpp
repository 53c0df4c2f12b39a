// Runs of the real binary that exercise checkpoints, resume and the stability guard.
#include <gtest/gtest.h>

#include <bit>
#include <fstream>
#include <map>

#include "checkpoint/checkpointer.h"
#include "checkpoint/tensor_file.h"
#include "harness.h"

namespace keel::testing {
namespace {

const std::string kShort = kQuickRun;

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<std::string> event_kinds(const std::filesystem::path& run_dir,
                                     bool skip_checkpoints = true) {
  std::vector<std::string> kinds;
  for (auto& e : read_jsonl(run_dir / "events.jsonl")) {
    auto k = e["kind"].get<std::string>();
    if (skip_checkpoints &&
        (k == "checkpoint" || k == "stable_snapshot" || k == "run_start" || k == "run_end" ||
         k == "resume" || k == "checkpoint_cadence" || k == "memory"))
      continue;
    // Advisory warnings (update ratio, clip rate, drift) carry a "signal"; alarms do not.
    if (skip_checkpoints && k == "warn" && e["detail"].contains("signal")) continue;
    kinds.push_back(k);
  }
  return kinds;
}

// 2N steps straight, and N steps + a kill -9 + resume + N steps, give the same losses bit for bit
// and the same final weights.
TEST(ResumeIntegration, KilledAndResumedRunIsBitExact) {
  ScratchDir a("resume_a"), b("resume_b");
  const std::string base = "train " + source_path("configs/tiny.yaml") + kShort +
                           " --set run.max_steps=12 --set checkpoint.every_steps=6";
  auto ra = run_keel(base + " --run-dir " + a.str());
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  // The crash fault kills the process (SIGKILL) at the start of iteration 8: the newest
  // checkpoint is step 6.
  auto rb =
      run_keel(base + " --run-dir " + b.str() + " --set 'faults=[{kind: crash, at_step: 8}]'");
  ASSERT_EQ(rb.exit_code, 128 + 9) << rb.output;
  auto rc = run_keel(base + " --run-dir " + b.str() + " --resume latest");
  ASSERT_EQ(rc.exit_code, 0) << rc.output;

  auto la = losses_by_step(a.path()), lb = losses_by_step(b.path());
  ASSERT_EQ(la.size(), 12u);
  for (auto& [step, loss] : la) {
    ASSERT_TRUE(lb.count(step)) << step;
    EXPECT_EQ(std::bit_cast<uint64_t>(loss), std::bit_cast<uint64_t>(lb[step])) << "step " << step;
  }
  auto wa = checkpoint::read_safetensors(a.path() / "checkpoints/step_00000012/model.safetensors");
  auto wb = checkpoint::read_safetensors(b.path() / "checkpoints/step_00000012/model.safetensors");
  ASSERT_EQ(wa.tensors.size(), wb.tensors.size());
  for (auto& [name, t] : wa.tensors) EXPECT_TRUE(torch::equal(t, wb.tensors.at(name))) << name;
  // Every component's saved state at the end (counters, data position, schedule, guard, RNG,
  // optimizer, repeat watch) is what the uninterrupted run saved: a member that changes during
  // training and is missing from its component's state differs after the resume.
  const auto step12 = [](const ScratchDir& d) { return d.path() / "checkpoints/step_00000012"; };
  const auto sa = read_json(step12(a) / "trainer_state.json");
  const auto sb = read_json(step12(b) / "trainer_state.json");
  for (const auto& [component, state] : sa.items()) {
    ASSERT_TRUE(sb.contains(component)) << component;
    EXPECT_EQ(state, sb[component]) << component;
  }
  EXPECT_EQ(sa.size(), sb.size());
  for (const char* stem : {"optimizer", "extra"}) {
    const std::string file = std::string(stem) + ".rank0.safetensors";
    auto ta = checkpoint::read_safetensors(step12(a) / file);
    auto tb = checkpoint::read_safetensors(step12(b) / file);
    ASSERT_EQ(ta.tensors.size(), tb.tensors.size()) << file;
    for (auto& [name, t] : ta.tensors)
      EXPECT_TRUE(torch::equal(t, tb.tensors.at(name))) << file << ": " << name;
  }
  auto kinds = event_kinds(b.path(), false);
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "resume"), kinds.end());
}

TEST(ResumeIntegration, ResumeLatestWithoutCheckpointStartsFresh) {
  ScratchDir d("resume_fresh");
  auto r = run_keel("train " + source_path("configs/tiny.yaml") + kShort +
                    " --set run.max_steps=3 --resume latest --run-dir " + d.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("starting fresh"), std::string::npos) << r.output;
}

TEST(ResumeIntegration, ChangedModelShapeIsRefused) {
  ScratchDir d("resume_shape");
  const std::string base =
      "train " + source_path("configs/tiny.yaml") + kShort + " --run-dir " + d.str();
  ASSERT_EQ(run_keel(base + " --set run.max_steps=3").exit_code, 0);
  auto r = run_keel(base + " --set run.max_steps=5 --set model.n_layers=3 --resume latest");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.n_layers"), std::string::npos) << r.output;
}

TEST(ResumeIntegration, CorruptNewestCheckpointFallsBack) {
  ScratchDir d("resume_corrupt");
  const std::string base = "train " + source_path("configs/tiny.yaml") + kShort +
                           " --set checkpoint.every_steps=2 --run-dir " + d.str();
  ASSERT_EQ(run_keel(base + " --set run.max_steps=4").exit_code, 0);
  auto weights = d.path() / "checkpoints/step_00000004/model.safetensors";
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_FALSE(checkpoint::verify_checkpoint(weights.parent_path()).ok);
  auto r = run_keel(base + " --set run.max_steps=6 --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
  auto events = read_jsonl(d.path() / "events.jsonl");
  bool resumed_from_2 = false;
  for (auto& e : events)
    if (e["kind"] == "resume") resumed_from_2 = e["detail"]["from_step"] == 2;
  EXPECT_TRUE(resumed_from_2);
}

// A NaN gradient is skipped: the run goes on, the step counter does not advance for it.
TEST(GuardIntegration, NanGradientIsSkipped) {
  ScratchDir d("guard_nan");
  auto r = run_keel("train " + source_path("configs/tiny.yaml") + kShort +
                    " --set run.max_steps=20 --set 'faults=[{kind: nan_grad, at_step: 12}]'"
                    " --run-dir " +
                    d.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(event_kinds(d.path()), std::vector<std::string>{"skip_nan"});
  auto events = read_jsonl(d.path() / "events.jsonl");
  auto metrics = read_jsonl(d.path() / "metrics.jsonl");
  EXPECT_EQ(metrics.back()["step"].get<int64_t>(), 20);
  for (auto& m : metrics) EXPECT_FALSE(m["loss"].is_null());
}

// The tiny model trained for 60 steps with stable snapshots every 10 and `faults`. The screen is
// off, so that the alarms meet garbage data (as they do whatever the screen lets through).
std::string guard_run(const ScratchDir& dir, const std::string& faults, const std::string& extra) {
  return "train " + source_path("configs/tiny.yaml") + kShort +
         " --set model.d_model=128 --set model.seq_len=128 --set optim.lr=3e-3"
         " --set run.max_steps=60 --set checkpoint.stable.every_steps=10"
         " --set stability.median_window=20 --set stability.screen.enabled=false"
         " --set 'faults=[" +
         faults + "]' --run-dir " + dir.str() + " " + extra;
}

// `steps` batches of random tokens from step 45: garbage whose loss is far above the median.
std::string corrupt_batch_run(const ScratchDir& dir, int corrupt_steps, const std::string& extra) {
  return guard_run(dir,
                   "{kind: corrupt_batch, mode: random_tokens, at_step: 45, steps: " +
                       std::to_string(corrupt_steps) + "}",
                   extra);
}

// A 100x lr on the update of step 44 breaks the model: the alarm at step 45 finds it worse than
// the stable snapshot on the reference batch, so it pauses, writes forensics, rolls back to the
// snapshot, recovers at a quarter of the lr, and the run still finishes.
TEST(GuardIntegration, ABrokenModelRollsBackToStable) {
  ScratchDir d("guard_rollback");
  auto r = run_keel(guard_run(d, "{kind: lr_spike, factor: 100, at_step: 44, steps: 1}",
                              "--set checkpoint.stable.window=5 --set stability.recovery.steps=5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto kinds = event_kinds(d.path());
  EXPECT_EQ(kinds.back(), "incident_end");  // the run re-earned its ground after recovering
  auto pos = [&](const std::string& k) {
    return std::find(kinds.begin(), kinds.end(), k) - kinds.begin();
  };
  EXPECT_LT(pos("pause"), pos("rollback"));
  EXPECT_LT(pos("rollback"), pos("recovery_start"));
  EXPECT_LT(pos("recovery_start"), pos("recovery_end"));
  for (auto& e : read_jsonl(d.path() / "events.jsonl")) {
    if (e["kind"] == "pause") EXPECT_EQ(e["detail"]["diagnosis"], "model") << e.dump();
    if (e["kind"] == "rollback") {
      EXPECT_EQ(e["detail"]["to_step"].get<int64_t>(), 40);
      // Steps 41..46 were taken since the stable snapshot; their data is never trained on again.
      EXPECT_EQ(e["detail"]["quarantine"]["samples"].get<int64_t>(), 6 * 16);
    }
  }
  // Every quarantined sample is on record, the paused step's own with the loss it measured.
  auto quarantine = read_jsonl(d.path() / "quarantine.jsonl");
  EXPECT_EQ(quarantine.size(), 6u * 16u);
  int with_loss = 0;
  for (auto& q : quarantine) {
    EXPECT_EQ(q["reason"], "rollback");
    with_loss += q.contains("loss");
  }
  EXPECT_EQ(with_loss, 16);
  std::ifstream in(d.path() / "forensics/step_00000045/samples.json");
  auto samples = nlohmann::json::parse(in);
  ASSERT_EQ(samples.size(), 8u);  // top_k_samples, by loss
  EXPECT_GE(samples[0]["loss"].get<double>(), samples[7]["loss"].get<double>());
  EXPECT_TRUE(samples[0].contains("sample_id"));
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"].get<int64_t>(), 60);
}

// Rollback from memory (issue 50): by default the stable snapshot a rollback goes back to is the
// copy each rank holds in host memory; with checkpoint.stable.memory_mb=0 it is read from the disk.
// Both give the same run, loss for loss, and each rollback event says where it restored from and
// how long it took.
TEST(GuardIntegration, ARollbackRestoresFromMemoryAsItWouldFromDisk) {
  ScratchDir memory("guard_rollback_memory"), disk("guard_rollback_disk");
  const std::string fault = "{kind: lr_spike, factor: 100, at_step: 44, steps: 1}";
  const std::string extra = "--set checkpoint.stable.window=5 --set stability.recovery.steps=5";
  auto r = run_keel(guard_run(memory, fault, extra));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel(guard_run(disk, fault, extra + " --set checkpoint.stable.memory_mb=0"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto restored = [](const ScratchDir& d) {
    std::vector<std::string> from;
    for (auto& e : read_jsonl(d.path() / "events.jsonl"))
      if (e["kind"] == "rollback") {
        EXPECT_GE(e["detail"]["restore_s"].get<double>(), 0.0) << e;
        from.push_back(e["detail"]["restored_from"].get<std::string>());
      }
    return from;
  };
  const auto from_memory = restored(memory), from_disk = restored(disk);
  ASSERT_FALSE(from_memory.empty());
  EXPECT_EQ(from_memory, std::vector<std::string>(from_memory.size(), "memory"));
  EXPECT_EQ(from_disk, std::vector<std::string>(from_memory.size(), "disk"));
  EXPECT_EQ(losses_by_step(memory.path()), losses_by_step(disk.path()));
}

// Garbage data with a healthy model: the alarm finds the model no worse than the stable snapshot,
// so the step is dropped and its samples set aside; nothing rolls back.
TEST(GuardIntegration, BadDataWithAHealthyModelIsDroppedNotRolledBack) {
  ScratchDir d("guard_corrupt");
  auto r = run_keel(corrupt_batch_run(d, 1, ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int pauses = 0;
  for (auto& e : read_jsonl(d.path() / "events.jsonl")) {
    EXPECT_NE(e["kind"], "rollback") << e.dump();
    if (e["kind"] != "pause") continue;
    ++pauses;
    EXPECT_EQ(e["detail"]["diagnosis"], "data") << e.dump();
    EXPECT_EQ(e["detail"]["skipped"], true) << e.dump();
  }
  EXPECT_EQ(pauses, 1);
  auto quarantine = read_jsonl(d.path() / "quarantine.jsonl");
  ASSERT_EQ(quarantine.size(), 16u);  // the step's micro-batch, each with its loss
  for (auto& q : quarantine) {
    EXPECT_EQ(q["reason"], "alarm");
    EXPECT_TRUE(q.contains("loss"));
  }
  EXPECT_TRUE(std::filesystem::exists(d.path() / "forensics/step_00000045/samples.json"));
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"].get<int64_t>(), 60);
}

// Every alarming step dropped, three attempts in a row without an update: with stuck_steps 3,
// the run that keeps meeting garbage stops, exit 3, saying why.
TEST(GuardIntegration, AStuckRunStopsWithExitThree) {
  ScratchDir d("guard_max");
  auto r = run_keel(corrupt_batch_run(d, 6, "--set stability.rollback.stuck_steps=3"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("stuck_steps=3"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
