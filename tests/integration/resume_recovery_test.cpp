// Resuming from a stable snapshot is a recovery: the lr overlay, the events, the data choice
// (skip or replay), the abandoned timeline kept aside, and the crash-loop fallback of
// --resume latest under a restarting launcher.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "harness.h"

namespace keel::testing {
namespace {

// Stable snapshots at 20 and 40, checkpoints every 5, a 10-step recovery; sample ids recorded.
const std::string kRun = kQuickRun +
                         " --set checkpoint.every_steps=5 --set checkpoint.stable.every_steps=20"
                         " --set checkpoint.stable.window=3 --set stability.recovery.steps=10"
                         " --set logging.sample_ids=true --set run.max_steps=60";

std::string train(const ScratchDir& d) {
  return "train " + source_path("configs/tiny.yaml") + kRun + " --run-dir " + d.str();
}

nlohmann::json event(const std::filesystem::path& run_dir, const std::string& kind) {
  for (auto& e : read_jsonl(run_dir / "events.jsonl"))
    if (e["kind"] == kind) return e;
  return nullptr;
}

// step -> sample ids of the step attempt that produced it, the last one written winning.
std::map<int64_t, std::vector<int64_t>> ids_by_step(const std::filesystem::path& run_dir) {
  std::map<int64_t, std::vector<int64_t>> out;
  for (auto& r : read_jsonl(run_dir / "samples.jsonl"))
    out[r["step"].get<int64_t>()] = r["ids"].get<std::vector<int64_t>>();
  return out;
}

// The first run stops at step 47 (as a run that went wrong after its stable snapshot at 40); its
// end writes step_47, the newest checkpoint.
void first_part(const ScratchDir& d) {
  auto r = run_keel(train(d) + " --set run.max_steps=47");
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

TEST(ResumeRecovery, ResumeStableRecoversAtAQuarterOfTheLr) {
  ScratchDir straight("recovery_straight"), d("recovery_stable");
  ASSERT_EQ(run_keel(train(straight)).exit_code, 0);
  first_part(d);
  auto r = run_keel(train(d) + " --resume stable");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  auto start = event(d.path(), "recovery_start");
  ASSERT_FALSE(start.is_null());
  EXPECT_EQ(start["step"], 40);
  EXPECT_EQ(start["detail"]["reason"], "resume_stable");
  EXPECT_NE(start["detail"]["checkpoint"].get<std::string>().find("step_00000040"),
            std::string::npos);
  EXPECT_EQ(start["detail"]["discarded_steps"], 7);  // 41..47: the newest checkpoint was 47
  auto end = event(d.path(), "recovery_end");
  ASSERT_FALSE(end.is_null());
  EXPECT_EQ(end["step"], 50);

  // The lr of updates 41..50 (metrics steps 41..50 log the update that made them) is a quarter of
  // the schedule's; from 51 on the schedule itself.
  std::map<int64_t, double> want, got;
  for (auto& m : read_jsonl(straight.path() / "metrics.jsonl")) want[m["step"]] = m["lr"];
  for (auto& m : read_jsonl(d.path() / "metrics.jsonl")) got[m["step"]] = m["lr"];
  for (int64_t step = 41; step <= 60; ++step) {
    const double factor = step <= 50 ? 0.25 : 1.0;
    EXPECT_NEAR(got[step], want[step] * factor, 1e-12) << "step " << step;
  }
}

TEST(ResumeRecovery, SkipSetsTheWindowAsideAndReplayTrainsOnItAgain) {
  ScratchDir skip("recovery_skip"), replay("recovery_replay");
  first_part(skip);
  first_part(replay);
  const auto before = ids_by_step(skip.path());  // the first timeline's steps 1..47
  ASSERT_EQ(run_keel(train(skip) + " --resume stable --resume-data skip").exit_code, 0);
  ASSERT_EQ(run_keel(train(replay) + " --resume stable --resume-data replay").exit_code, 0);

  // replay: steps 41.. train on exactly the samples the first timeline used for 41..
  const auto replayed = ids_by_step(replay.path());
  for (int64_t step = 41; step <= 47; ++step) EXPECT_EQ(replayed.at(step), before.at(step)) << step;

  // skip: the samples of steps 41..47 (up to the newest checkpoint) are in quarantine.jsonl with
  // the reason, and no step after the resume trains on any of them.
  std::set<int64_t> quarantined;
  for (auto& q : read_jsonl(skip.path() / "quarantine.jsonl")) {
    EXPECT_EQ(q["reason"], "resume_stable");
    quarantined.insert(q["id"].get<int64_t>());
  }
  std::set<int64_t> window;
  for (int64_t step = 41; step <= 47; ++step)
    window.insert(before.at(step).begin(), before.at(step).end());
  EXPECT_EQ(quarantined, window);
  const auto after = ids_by_step(skip.path());
  for (int64_t step = 41; step <= 60; ++step)
    for (int64_t id : after.at(step))
      EXPECT_FALSE(quarantined.count(id)) << "sample " << id << " trained again at step " << step;
  // And the data order goes on right after the window (synthetic ids count up in order).
  EXPECT_EQ(after.at(41).front(), before.at(47).back() + 1);
}

TEST(ResumeRecovery, TheAbandonedTimelineIsKeptAsideAndVerifies) {
  ScratchDir d("recovery_abandoned");
  first_part(d);
  ASSERT_EQ(run_keel(train(d) + " --resume stable").exit_code, 0);
  auto start = event(d.path(), "recovery_start");
  ASSERT_TRUE(start["detail"].contains("abandoned_timeline")) << start.dump();
  const std::filesystem::path timeline = start["detail"]["abandoned_timeline"].get<std::string>();
  // The old step 45 survives the new timeline's own save of step 45, and verifies.
  ASSERT_TRUE(std::filesystem::exists(timeline / "step_00000045"));
  bool resumed = false, saved_45_again = false;
  for (auto& e : read_jsonl(d.path() / "events.jsonl")) {
    resumed |= e["kind"] == "resume";
    saved_45_again |= resumed && e["kind"] == "checkpoint" && e["step"] == 45;
  }
  EXPECT_TRUE(saved_45_again);
  auto old45 = run_keel("inspect " + (timeline / "step_00000045").string());
  EXPECT_EQ(old45.exit_code, 0) << old45.output;
  auto report = run_keel("inspect " + d.str());
  EXPECT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(report.output.find("abandoned timeline"), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("resume stable"), std::string::npos) << report.output;
}

// Under a restart loop, a crash at a fixed iteration kills the run twice from the same checkpoint;
// the third start falls back to the stable snapshot as a recovery and finishes.
TEST(ResumeRecovery, CrashLoopFallsBackToStable) {
  ScratchDir d("recovery_crash_loop");
  const std::string args =
      train(d) + " --resume latest --set 'faults=[{kind: crash, at_step: 27}]'";
  EXPECT_EQ(run_keel(args).exit_code, 128 + 9);
  EXPECT_EQ(run_keel(args).exit_code, 128 + 9);
  auto third = run_keel(args);
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_NE(third.output.find("ended abnormally twice"), std::string::npos) << third.output;
  auto loop = event(d.path(), "crash_loop");
  ASSERT_FALSE(loop.is_null());
  auto start = event(d.path(), "recovery_start");
  ASSERT_FALSE(start.is_null());
  EXPECT_EQ(start["detail"]["reason"], "crash_loop");
  EXPECT_EQ(start["step"], 20);  // the newest stable snapshot
  int abnormal = 0;
  for (auto& s : read_jsonl(d.path() / "starts.jsonl")) abnormal += s["event"] == "abnormal_end";
  EXPECT_EQ(abnormal, 2);
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], 60);
}

}  // namespace
}  // namespace keel::testing
