// Data, model or machine (issue 48): an alarm's step is computed again before its data is blamed.
// A corrupt_grad fault makes one rank's gradient wrong as a failing device would, the data clean:
// once, the replay names the rank and the run ends as the clean run does; every time, the job
// stops with kExitFaultyDevice after a checkpoint, naming the host for the requeue to leave out.
// A bad batch still reproduces and is still the data's.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "harness.h"

namespace keel::testing {
namespace {

std::string run_args(const ScratchDir& d, int steps, const std::string& extra = "") {
  return "train --run-dir " + d.str() + kQuickRun + " --set data.micro_batch_size=8" +
         " --set run.max_steps=" + std::to_string(steps) + " --set checkpoint.every_steps=10" +
         extra;
}

std::vector<nlohmann::json> events(const ScratchDir& d, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (auto& e : read_jsonl(d.path() / "events.jsonl"))
    if (e["kind"] == kind) out.push_back(e);
  return out;
}

// A one-off fault on `rank` at step 30 is named, nothing is quarantined or rolled back, and every
// logged loss equals the clean run's (the golden records' tolerance: another CPU may sum
// differently, this one computes the same step again).
void expect_one_off_fault_is_the_machines(const std::string& launch, int rank,
                                          const std::string& extra) {
  ScratchDir clean("machine_clean"), faulty("machine_once");
  auto r = run_keel(launch + run_args(clean, 40, extra));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("computed again"), std::string::npos) << "the noise is measured";
  r = run_keel(launch + run_args(faulty, 40, extra) +
               " --set 'faults=[{kind: corrupt_grad, at_step: 30, rank: " + std::to_string(rank) +
               "}]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto faults = events(faulty, "hardware_fault");
  ASSERT_EQ(faults.size(), 1u) << r.output;
  const auto& detail = faults[0]["detail"];
  EXPECT_EQ(faults[0]["step"], 30);
  EXPECT_EQ(detail["ranks"], nlohmann::json::array({rank}));
  EXPECT_EQ(detail["cause"], "not_reproduced");
  EXPECT_FALSE(detail["persistent"].get<bool>());
  EXPECT_NE(r.output.find("computed a wrong result once"), std::string::npos) << r.output;
  EXPECT_TRUE(read_jsonl(faulty.path() / "quarantine.jsonl").empty()) << "the data is clean";
  EXPECT_TRUE(events(faulty, "pause").empty());
  EXPECT_TRUE(events(faulty, "rollback").empty());
  const auto want = losses_by_step(clean.path()), got = losses_by_step(faulty.path());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want)
    EXPECT_NEAR(got.at(step), loss, 1e-4 * loss) << "step " << step;
}

TEST(MachineFaults, AOneOffWrongGradientIsTheMachinesAndTheRunEndsAsTheCleanOne) {
  expect_one_off_fault_is_the_machines("", 0, "");
}

TEST(MachineFaults, UnderTwoRanksTheRankThatComputedWrongIsNamed) {
  expect_one_off_fault_is_the_machines("launch --nproc 2 -- ", 1, "");
}

TEST(MachineFaults, UnderZeroTwoAndThreeWithAccumulationTheRankIsNamedToo) {
  for (const char* zero : {"2", "3"})
    expect_one_off_fault_is_the_machines(
        "launch --nproc 2 -- ", 1,
        std::string(" --set data.grad_accum_steps=2 --set distributed.zero=") + zero);
}

// A device wrong every time: its data computes right on the other rank, its replay of the other
// rank's data is wrong too. The job stops with exit 4 after saving the last applied step, names
// the host and lists it in exclude_hosts; a resume (on a healthy machine: no fault) goes on from
// that checkpoint and trains on the data of the step the device got wrong (not skipped): every
// loss is the clean run's, to the bit.
TEST(MachineFaults, ADeviceWrongEveryTimeStopsTheJobAfterACheckpoint) {
  ScratchDir d("machine_persistent");
  auto r = run_keel("launch --nproc 2 -- " + run_args(d, 40) +
                    " --set 'faults=[{kind: corrupt_grad, at_step: 25, rank: 1, persistent: "
                    "true}]'");
  ASSERT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("a faulty device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exclude_hosts"), std::string::npos) << r.output;
  const auto faults = events(d, "hardware_fault");
  ASSERT_EQ(faults.size(), 1u) << r.output;
  EXPECT_EQ(faults[0]["detail"]["cause"], "persistent");
  EXPECT_EQ(faults[0]["detail"]["ranks"], nlohmann::json::array({1}));
  const auto aborts = events(d, "abort");
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0]["detail"]["reason"], "faulty_device");
  std::ifstream hosts(d.path() / "exclude_hosts");
  std::string host;
  ASSERT_TRUE(std::getline(hosts, host)) << "no host to leave out";
  EXPECT_FALSE(host.empty());
  EXPECT_EQ(host.find(' '), std::string::npos) << "a host name alone: " << host;
  EXPECT_TRUE(std::filesystem::exists(d.path() / "checkpoints/step_00000025"))
      << "the last applied step is saved";
  EXPECT_TRUE(read_jsonl(d.path() / "quarantine.jsonl").empty());

  r = run_keel("launch --nproc 2 -- " + run_args(d, 40) + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], 40);
  EXPECT_EQ(events(d, "resume").back()["detail"]["from_step"], 25) << r.output;
  ScratchDir clean("machine_persistent_clean");
  r = run_keel("launch --nproc 2 -- " + run_args(clean, 40));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses_by_step(d.path()), losses_by_step(clean.path()));
}

// One process: a second one-off fault within the window is a device that keeps failing.
TEST(MachineFaults, ASecondFaultOfTheSameDeviceWithinTheWindowStopsTheRun) {
  ScratchDir d("machine_twice");
  auto r = run_keel(run_args(d, 40) +
                    " --set 'faults=[{kind: corrupt_grad, at_step: 20, rank: 0},"
                    " {kind: corrupt_grad, at_step: 31, rank: 0}]'");
  ASSERT_EQ(r.exit_code, 4) << r.output;
  EXPECT_EQ(events(d, "hardware_fault").size(), 2u);
  EXPECT_NE(r.output.find("computed a wrong result 2 times within 1000 attempts"),
            std::string::npos)
      << r.output;
}

// A bit of one rank's weights flips (a memory error): training barely notices, the replicas'
// comparison does. With three ranks the majority names rank 2; every rank restores the newest
// checkpoint (saved when they agreed) and replays the data, so the run ends as the clean one.
TEST(MachineFaults, AReplicaWhoseWeightsDivergedIsNamedAndEveryRankRestores) {
  const std::string launch = "launch --nproc 3 -- ";
  const std::string extra = " --set stability.replica_check_every=5";
  ScratchDir clean("replicas_clean"), flipped("replicas_flipped");
  auto r = run_keel(launch + run_args(clean, 30, extra));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel(launch + run_args(flipped, 30, extra) +
               " --set 'faults=[{kind: flip_bit, at_step: 12, rank: 2}]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto faults = events(flipped, "hardware_fault");
  ASSERT_EQ(faults.size(), 1u) << r.output;
  EXPECT_EQ(faults[0]["step"], 15) << "found at the next comparison";
  EXPECT_EQ(faults[0]["detail"]["cause"], "replicas_diverged");
  EXPECT_EQ(faults[0]["detail"]["ranks"], nlohmann::json::array({2}));
  EXPECT_NE(r.output.find("checkpoints/step_00000010 on every rank"), std::string::npos)
      << r.output;
  EXPECT_TRUE(read_jsonl(flipped.path() / "quarantine.jsonl").empty());
  const auto want = losses_by_step(clean.path()), got = losses_by_step(flipped.path());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;
}

// A bad batch is the data's on any device: the replay reproduces it, the guard quarantines as
// before, no machine fault is named (under two ranks, where its rank's data is replayed on the
// other).
TEST(MachineFaults, ABadBatchReproducesAndStaysTheDatas) {
  ScratchDir d("machine_bad_batch");
  auto r = run_keel("launch --nproc 2 -- " + run_args(d, 40) +
                    " --set 'faults=[{kind: corrupt_batch, at_step: 30, steps: 1, rank: 1,"
                    " mode: repeat_token}]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(events(d, "hardware_fault").empty()) << r.output;
  EXPECT_FALSE(read_jsonl(d.path() / "quarantine.jsonl").empty()) << r.output;
  int replayed = 0;  // the alarm's event carries what its replay cost
  for (auto& e : read_jsonl(d.path() / "events.jsonl"))
    replayed += e["detail"].contains("replay_s") && e["step"] == 30;
  EXPECT_EQ(replayed, 1) << "the alarm's step was not computed again";
}

}  // namespace
}  // namespace keel::testing
