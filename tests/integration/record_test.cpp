// The run record never lies: runs of the real binary whose metrics.jsonl and events.jsonl must say
// exactly what happened — the abort that ends a run, the guard's decisions across a kill and a
// resume, the clipping actually applied, and a run that stops when its record cannot be written.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <tuple>

#include "harness.h"

namespace keel::testing {
namespace {

const std::string kShort = kQuickRun;

std::string tiny() { return "train " + source_path("configs/tiny.yaml") + kShort; }

// (kind, step, signal) of every guard event, as a set: a resumed run writes the steps between
// its checkpoint and the kill a second time, and the same decision twice is one decision.
using GuardEvent = std::tuple<std::string, int64_t, std::string>;
std::set<GuardEvent> guard_events(const std::filesystem::path& run_dir) {
  static const std::set<std::string> kGuardKinds = {
      "warn",     "screen",         "pause",        "skip_nan",     "overflow",
      "rollback", "recovery_start", "recovery_end", "incident_end", "abort"};
  std::set<GuardEvent> out;
  for (auto& e : read_jsonl(run_dir / "events.jsonl")) {
    const auto kind = e["kind"].get<std::string>();
    if (!kGuardKinds.count(kind)) continue;
    std::string signal;
    if (e.contains("detail") && e["detail"].contains("signal"))
      signal = e["detail"]["signal"].get<std::string>();
    out.emplace(kind, e["step"].get<int64_t>(), signal);
  }
  return out;
}

// step -> lr of the metrics lines (the last line for a step wins, as a resumed run rewrites them).
std::map<int64_t, double> lr_by_step(const std::filesystem::path& run_dir) {
  std::map<int64_t, double> out;
  for (auto& m : read_jsonl(run_dir / "metrics.jsonl"))
    out[m["step"].get<int64_t>()] = m["lr"].get<double>();
  return out;
}

// Runs `args` with `faults` straight into `a`, and into `b` with a kill -9 at `crash_iteration`
// added, followed by --resume latest; the guard's events and the learning rates must be the same.
void expect_resume_matches(const std::string& args, const std::string& faults,
                           int crash_iteration) {
  ScratchDir a("record_resume_a"), b("record_resume_b");
  const std::string sep = faults.empty() ? "" : ", ";
  auto ra = run_keel(args + " --set 'faults=[" + faults + "]' --run-dir " + a.str());
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  auto rb = run_keel(args + " --run-dir " + b.str() + " --set 'faults=[" + faults + sep +
                     "{kind: crash, at_step: " + std::to_string(crash_iteration) + "}]'");
  ASSERT_EQ(rb.exit_code, 128 + 9) << rb.output;
  auto rc =
      run_keel(args + " --set 'faults=[" + faults + "]' --run-dir " + b.str() + " --resume latest");
  ASSERT_EQ(rc.exit_code, 0) << rc.output;
  EXPECT_EQ(guard_events(a.path()), guard_events(b.path()));
  EXPECT_EQ(lr_by_step(a.path()), lr_by_step(b.path()));
  EXPECT_FALSE(guard_events(a.path()).empty());
}

// Clipping on every step (grad_clip far below the norm) makes the clip-rate warning fire once the
// window is full and then stay quiet for a window: the kill lands inside that quiet window.
TEST(RecordIntegration, ResumeInsideAWarnWindowGivesTheSameEvents) {
  expect_resume_matches(tiny() +
                            " --set run.max_steps=50 --set optim.grad_clip=0.001"
                            " --set stability.median_window=20 --set checkpoint.every_steps=5",
                        "", /*crash_iteration=*/28);
}

// A 100x lr on step 44's update breaks the model; the alarm at 45 rolls back to the stable
// snapshot at 40; recovery runs to step 50. The checkpoint at step 45 of the new lineage is inside
// recovery, and so is the kill.
TEST(RecordIntegration, ResumeInsideRecoveryGivesTheSameEventsAndLr) {
  expect_resume_matches(tiny() +
                            " --set model.d_model=128 --set model.seq_len=128 --set optim.lr=3e-3"
                            " --set run.max_steps=56 --set checkpoint.stable.every_steps=10"
                            " --set checkpoint.every_steps=5 --set checkpoint.stable.window=5"
                            " --set stability.median_window=20 --set stability.recovery.steps=10"
                            " --set stability.screen.enabled=false",
                        "{kind: lr_spike, factor: 100, at_step: 44, steps: 1}",
                        /*crash_iteration=*/53);
}

// A stuck run (garbage on a healthy model: each alarming step dropped, three attempts in a row
// without an update) stops with exit 3, and events.jsonl ends with the abort and why.
TEST(RecordIntegration, AStuckRunEndsTheRecordWithTheAbort) {
  ScratchDir d("record_abort");
  auto r = run_keel(tiny() +
                    " --set model.d_model=128 --set model.seq_len=128 --set optim.lr=3e-3"
                    " --set run.max_steps=60 --set checkpoint.stable.every_steps=10"
                    " --set stability.median_window=20 --set stability.rollback.max_rollbacks=1"
                    " --set stability.rollback.stuck_steps=3 --set stability.screen.enabled=false"
                    " --set 'faults=[{kind: corrupt_batch, mode: random_tokens, at_step: 45, "
                    "steps: 6}]' --run-dir " +
                    d.str());
  ASSERT_EQ(r.exit_code, 3) << r.output;
  auto events = read_jsonl(d.path() / "events.jsonl");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["kind"], "abort") << events.back().dump();
  EXPECT_EQ(events.back()["detail"]["reason"], "stuck");
  ASSERT_EQ(events.back()["detail"]["incidents"].size(), 1u);
  EXPECT_EQ(events.back()["detail"]["incidents"][0]["rollbacks"], 0);
  EXPECT_EQ(events.back()["detail"]["incidents"][0]["skipped_steps"], 3);
}

TEST(RecordIntegration, NanPolicyAbortEndsTheRecordWithTheAbort) {
  ScratchDir d("record_nan_abort");
  auto r = run_keel(tiny() +
                    " --set run.max_steps=20 --set stability.nan_policy=abort"
                    " --set 'faults=[{kind: nan_grad, at_step: 12}]' --run-dir " +
                    d.str());
  ASSERT_EQ(r.exit_code, 3) << r.output;
  auto events = read_jsonl(d.path() / "events.jsonl");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["kind"], "abort");
  EXPECT_EQ(events.back()["detail"]["reason"], "non_finite");
  EXPECT_EQ(events.back()["step"], 12);
}

// In adaptive mode the bound is the z-score bound, far below grad_clip here: `clipped` must say
// whether that bound clipped, and the bound is on record.
TEST(RecordIntegration, AdaptiveClippingRecordsTheBoundItApplied) {
  ScratchDir d("record_adaptive");
  auto r = run_keel(tiny() +
                    " --set run.max_steps=40 --set optim.clip_mode=adaptive"
                    " --set optim.grad_clip=100 --set optim.adaptive_clip_z=0.5 --run-dir " +
                    d.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int clipped = 0;
  for (auto& m : read_jsonl(d.path() / "metrics.jsonl")) {
    const double norm = m["grad_norm"].get<double>(), bound = m["clip_bound"].get<double>();
    EXPECT_LE(bound, 100.0);
    EXPECT_EQ(m["clipped"].get<bool>(), norm > bound) << m.dump();
    clipped += m["clipped"].get<bool>();
  }
  EXPECT_GT(clipped, 0) << "an adaptive bound at mean + 0.5 sd clips some steps";
}

// The run directory sits on a 96 KiB tmpfs that metrics.jsonl fills; the checkpoints go
// elsewhere. The run must stop (exit 3) naming the file and the cause, write a last checkpoint,
// and leave every checkpoint verifiable.
TEST(RecordIntegration, FullDiskForTheRecordStopsTheRunAndKeepsCheckpoints) {
  ScratchDir run("record_full_disk"), ckpt("record_full_disk_ckpt");
  if (::mount("tmpfs", run.path().c_str(), "tmpfs", 0, "size=96k") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): " << std::strerror(errno);
  struct Unmount {
    std::filesystem::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{run.path()};
  auto r = run_keel(tiny() + " --set run.max_steps=2000 --set checkpoint.every_steps=50" +
                    " --set checkpoint.dir=" + ckpt.str() + " --run-dir " + run.str());
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(".jsonl"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("last checkpoint written"), std::string::npos) << r.output;
  auto inspect = run_keel("inspect " + ckpt.str());
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("verify:      OK"), std::string::npos) << inspect.output;
  // It stopped early: nowhere near the 2000 steps it was asked for.
  auto metrics = read_jsonl(run.path() / "metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  EXPECT_LT(metrics.back()["step"].get<int64_t>(), 2000);
}

// A fresh start in a directory that holds a run moves that run aside whole: the new metrics.jsonl
// holds the new run alone, and the old record and checkpoints are under previous/<time>/.
TEST(RecordIntegration, AFreshStartSetsTheEarlierRunAside) {
  ScratchDir dir("fresh_again");
  const std::string args = "train" + kQuickRun + " --run-dir " + dir.str() +
                           " --set run.max_steps=6 --set checkpoint.every_steps=3";
  ASSERT_EQ(run_keel(args + " --profile 2").exit_code, 0);
  ASSERT_TRUE(std::filesystem::exists(dir.path() / "profile"));
  std::ofstream(dir.path() / "notes.txt") << "the user's own file\n";
  auto r = run_keel(args + " --set run.max_steps=4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("held an earlier run"), std::string::npos) << r.output;
  std::vector<int64_t> steps;
  for (auto& m : read_jsonl(dir.path() / "metrics.jsonl")) steps.push_back(m["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  std::vector<std::filesystem::path> aside;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() / "previous"))
    aside.push_back(e.path());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(read_jsonl(aside[0] / "metrics.jsonl").size(), 6u);
  EXPECT_TRUE(std::filesystem::exists(aside[0] / "checkpoints" / "step_00000006"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "checkpoints" / "step_00000006"));
  EXPECT_TRUE(std::filesystem::exists(aside[0] / "profile"));  // the trace goes with its run
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "profile"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "notes.txt"));  // only keel's record moves
}

}  // namespace
}  // namespace keel::testing
