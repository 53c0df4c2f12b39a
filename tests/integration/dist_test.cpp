// Many ranks over c10d on the CPU (Gloo on loopback): `keel launch` and torchrun start ranks of the
// real binary; two ranks of micro-batch B train as one rank of 2B does.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "harness.h"

namespace keel::testing {
namespace {

// The embedded tiny config, small and deterministic, every step logged.
std::string tiny_args(const ScratchDir& d, int micro_batch, int steps) {
  return "train --run-dir " + d.str() + kQuickRun +
         " --set data.micro_batch_size=" + std::to_string(micro_batch) +
         " --set run.max_steps=" + std::to_string(steps) + " --set checkpoint.every_steps=0";
}

std::string fmt_step(int64_t step) {
  char name[16];
  std::snprintf(name, sizeof name, "%08lld", static_cast<long long>(step));
  return name;
}

std::map<int64_t, double> losses(const ScratchDir& d) {
  std::map<int64_t, double> out;
  for (auto& m : read_jsonl(d.path() / "metrics.jsonl")) {
    const int64_t step = m["step"].get<int64_t>();
    EXPECT_EQ(out.count(step), 0u) << "step " << step << " logged twice";
    out[step] = m["loss"].get<double>();
  }
  return out;
}

void expect_same_losses(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << step;
    EXPECT_NEAR(b.at(step), loss, 1e-3 * std::abs(loss)) << "step " << step;
  }
}

// Whether a line of `rank`'s ("[rank R] ...") in a launch's output holds `text` and not `unless`.
bool rank_logged(const std::string& output, const std::string& rank, const std::string& text,
                 const std::string& unless = "") {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(rank, 0) == 0 && line.find(text) != std::string::npos &&
        (unless.empty() || line.find(unless) == std::string::npos))
      return true;
  return false;
}

int events_of_kind(const ScratchDir& d, const std::string& kind) {
  int n = 0;
  for (auto& e : read_jsonl(d.path() / "events.jsonl")) n += e["kind"] == kind;
  return n;
}

// Two ranks each take half of every global micro-batch (the same samples one rank of 2B takes),
// the gradients are averaged over the ranks and every guard decision is taken on all of them.
TEST(DistIntegration, TwoRanksOfBTrainAsOneRankOf2B) {
  ScratchDir one("dist_one"), two("dist_two");
  auto r1 = run_keel(tiny_args(one, 16, 50));
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = run_keel("launch --nproc 2 -- " + tiny_args(two, 8, 50));
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_NE(r2.output.find("[rank 0] "), std::string::npos) << r2.output;  // the launcher's prefix
  std::istringstream lines(r2.output);  // and only the launcher's: the rank is not named twice
  for (std::string line; std::getline(lines, line);)
    EXPECT_EQ(line.find("[rank", 1), std::string::npos) << line;
  const auto a = losses(one), b = losses(two);
  EXPECT_EQ(a.size(), 50u);
  expect_same_losses(a, b);
  for (auto& e : read_jsonl(two.path() / "events.jsonl"))
    if (e["kind"] == "run_start") EXPECT_EQ(e["detail"]["world_size"], 2);

  // The gradient buckets that overlap the backward pass against one flat all-reduce after it,
  // with many small buckets, and with gradient accumulation (only the last micro-step reduces):
  // the same training either way.
  ScratchDir flat("dist_flat"), buckets("dist_buckets"), accum("dist_accum");
  auto r3 = run_keel("launch --nproc 2 -- " + tiny_args(flat, 8, 50) +
                     " --set distributed.overlap=false");
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  expect_same_losses(a, losses(flat));
  auto r4 = run_keel("launch --nproc 2 -- " + tiny_args(buckets, 8, 50) +
                     " --set distributed.bucket_mb=0.1");
  ASSERT_EQ(r4.exit_code, 0) << r4.output;
  expect_same_losses(a, losses(buckets));
  std::smatch m;  // every bucket started from autograd's hooks, none left for after the backward
  const std::regex report(R"((\d+) buckets; (\d+) of them started during the backward pass)");
  ASSERT_TRUE(std::regex_search(r4.output, m, report)) << r4.output;
  EXPECT_GT(std::stoi(m[1]), 2);
  EXPECT_EQ(m[1], m[2]);
  auto r5 = run_keel("launch --nproc 2 -- " + tiny_args(accum, 4, 50) +
                     " --set data.grad_accum_steps=2 --set distributed.bucket_mb=0.1");
  ASSERT_EQ(r5.exit_code, 0) << r5.output;
  expect_same_losses(a, losses(accum));

  // ZeRO-1: the buckets are reduce-scattered, each rank updates its half of the weights with its
  // half of the AdamW state, and the halves are all-gathered: the same training again; also with
  // the buckets reduced after the backward pass and gradient accumulation.
  ScratchDir zero("dist_zero"), zero_late("dist_zero_late");
  auto r6 = run_keel("launch --nproc 2 -- " + tiny_args(zero, 8, 50) + " --set distributed.zero=1");
  ASSERT_EQ(r6.exit_code, 0) << r6.output;
  EXPECT_NE(r6.output.find("(zero1: state sharded over 2 ranks)"), std::string::npos) << r6.output;
  EXPECT_NE(r6.output.find("gradients reduce-scattered in "), std::string::npos) << r6.output;
  expect_same_losses(a, losses(zero));
  auto r7 = run_keel("launch --nproc 2 -- " + tiny_args(zero_late, 4, 50) +
                     " --set distributed.zero=1 --set distributed.overlap=false"
                     " --set data.grad_accum_steps=2");
  ASSERT_EQ(r7.exit_code, 0) << r7.output;
  expect_same_losses(a, losses(zero_late));

  // Activation checkpointing recomputes blocks inside the backward pass whose gradient hooks
  // start the buckets, and the chunked loss computes the head's gradient itself: the same
  // training with both, under ZeRO-2 (every micro-step reduced, gradients released, at most two
  // small buckets in flight) with accumulation.
  ScratchDir recompute("dist_recompute");
  auto r8 = run_keel("launch --nproc 2 -- " + tiny_args(recompute, 4, 50) +
                     " --set distributed.zero=2 --set distributed.bucket_mb=0.1"
                     " --set data.grad_accum_steps=2 --set model.activation_checkpointing=full"
                     " --set model.chunked_loss=on");
  ASSERT_EQ(r8.exit_code, 0) << r8.output;
  EXPECT_NE(r8.output.find("(zero2: state and gradients sharded over 2 ranks)"), std::string::npos)
      << r8.output;
  expect_same_losses(a, losses(recompute));
  ScratchDir zero2_late("dist_zero2_late");  // ZeRO-2 with the buckets reduced after the backward
  auto r9 = run_keel("launch --nproc 2 -- " + tiny_args(zero2_late, 8, 50) +
                     " --set distributed.zero=2 --set distributed.overlap=false");
  ASSERT_EQ(r9.exit_code, 0) << r9.output;
  expect_same_losses(a, losses(zero2_late));
}

// The guard's signals are reduced over the ranks, so every rank takes the same decision. Bad data
// on rank 1 only: both ranks drop the step, and the record names the samples of both (the screen is
// off, so the loss alarm sees the step). A 100x lr on step 44's update, then: both ranks roll back
// to the same stable snapshot and recover together. `extra` is added (ZeRO-1 or not).
void expect_guard_decisions_together(const std::string& name, const std::string& extra) {
  ScratchDir d(name);
  auto r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 56) + extra +
                    " --set model.d_model=128 --set model.seq_len=128 --set optim.lr=3e-3"
                    " --set checkpoint.stable.every_steps=10 --set stability.median_window=20"
                    " --set stability.recovery.steps=10 --set stability.screen.enabled=false"
                    " --set 'faults=[{kind: corrupt_batch, mode: random_tokens, at_step: 24,"
                    " steps: 1, rank: 1}, {kind: lr_spike, factor: 100, at_step: 44, steps: 1}]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(events_of_kind(d, "pause"), 2) << r.output;
  EXPECT_GE(events_of_kind(d, "rollback"), 1) << r.output;
  for (const char* rank : {"[rank 0]", "[rank 1]"})
    EXPECT_TRUE(rank_logged(r.output, rank, "rolled back")) << rank << " did not roll back:\n"
                                                            << r.output;
  // Synthetic ids are position x 16 + b: rank 0 holds b in [0, 8), rank 1 b in [8, 16).
  bool rank0 = false, rank1 = false;
  for (auto& q : read_jsonl(d.path() / "quarantine.jsonl")) {
    const int64_t b = q["id"].get<int64_t>() % 16;
    rank0 |= b < 8;
    rank1 |= b >= 8;
  }
  EXPECT_TRUE(rank0 && rank1) << "the quarantine must name both ranks' samples";
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], 56);
}

TEST(DistIntegration, BothRanksTakeTheGuardsDecisionsTogether) {
  expect_guard_decisions_together("dist_guard", "");
}

// Under ZeRO-1 a rollback restores each rank's part of the optimizer state.
// A device that computes one wrong result: rank 1's reduced gradients differ from rank 0's at one
// step (a grad_growth fault undone on rank 1 alone). The ranks used to decide differently and die
// inside Gloo; now every rank skips that step, a hardware_fault event names every rank's norm and
// rank 1 (no majority of two: its own part of the step, grown 10000x, stood out),
// nothing is quarantined, nothing rolls back, and the run finishes. A second such step within the
// window stops it as a faulty device (exit 4), naming the fault.
TEST(DistIntegration, ReplicasThatDisagreeSkipTheStepTogether) {
  for (const char* gate : {"device", "host"}) {
    ScratchDir d("dist_replica_fault");
    auto r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 30) +
                      " --set stability.update_gate=" + gate +
                      " --set 'faults=[{kind: grad_growth, factor: 10000, at_step: 20, steps: 1,"
                      " rank: 1}]'");
    ASSERT_EQ(r.exit_code, 0) << gate << "\n" << r.output;
    std::vector<nlohmann::json> faults;
    for (auto& e : read_jsonl(d.path() / "events.jsonl")) {
      EXPECT_NE(e["kind"], "pause") << e.dump();
      EXPECT_NE(e["kind"], "rollback") << e.dump();
      if (e["kind"] == "hardware_fault") faults.push_back(e);
    }
    ASSERT_EQ(faults.size(), 1u) << gate << "\n" << r.output;
    const auto& detail = faults[0]["detail"];
    ASSERT_EQ(detail["rank_grad_norms"].size(), 2u);
    EXPECT_NE(detail["rank_grad_norms"][0], detail["rank_grad_norms"][1]);
    EXPECT_EQ(detail["ranks"], nlohmann::json::array({1}))
        << "two ranks hold no majority: the one whose own part stood out";
    ASSERT_EQ(detail["hosts"].size(), 2u);
    EXPECT_NE(detail["hosts"][1].get<std::string>().find("cpu"), std::string::npos);
    EXPECT_TRUE(read_jsonl(d.path() / "quarantine.jsonl").empty()) << "the data is not blamed";
    EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], 30);
    EXPECT_NE(r.output.find("a device computed a wrong result"), std::string::npos) << r.output;
  }
  ScratchDir d("dist_replica_faulty");
  auto r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 30) +
                    " --set 'faults=[{kind: grad_growth, factor: 10000, at_step: 20, steps: 3,"
                    " rank: 1}]'");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("a faulty device"), std::string::npos) << r.output;
}

// A peak the model cannot take, under two ranks: both read the same (rank-mean) attention growth,
// roll back to the same snapshot and lower the peak together (issue 47); an lr spike past the
// judged window then rolls both back from an incident, on the lowered schedule.
TEST(DistIntegration, BothRanksBackOffAndRollBackTogether) {
  ScratchDir d("dist_backoff");
  auto r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 140) +
                    " --set optim.lr=0.09 --set checkpoint.every_steps=10"
                    " --set stability.median_window=20 --set stability.recovery.steps=10"
                    " --set 'faults=[{kind: lr_spike, factor: 100, at_step: 125, steps: 1}]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int backoffs = events_of_kind(d, "schedule_backoff");
  EXPECT_GE(backoffs, 1) << r.output;
  EXPECT_GE(events_of_kind(d, "rollback"), 1) << r.output;
  for (const char* rank : {"[rank 0]", "[rank 1]"}) {
    EXPECT_TRUE(rank_logged(r.output, rank, "lowered the schedule's peak"))
        << rank << " did not back off:\n"
        << r.output;
    EXPECT_TRUE(rank_logged(r.output, rank, "rolled back", "lowered the schedule's peak"))
        << rank << " did not roll back:\n"
        << r.output;
  }
  const auto metrics = read_jsonl(d.path() / "metrics.jsonl");
  EXPECT_EQ(metrics.back()["step"], 140);
  // The cosine's floor (0.1 x peak) of the lowered peak.
  EXPECT_NEAR(metrics.back()["lr"].get<double>(), 0.09 * 0.1 * std::pow(0.1, backoffs / 2.0),
              1e-2 * 0.009 * std::pow(0.1, backoffs / 2.0))
      << "the lowered schedule";
}

TEST(DistIntegration, BothRanksTakeTheGuardsDecisionsTogetherUnderZeroOne) {
  expect_guard_decisions_together("dist_guard_zero", " --set distributed.zero=1");
}

// Four ranks of B/4 with ZeRO-2 and ZeRO-3, and two ranks of B/4 with two micro-steps of
// accumulation, each with and without full activation checkpointing: the losses of one rank of B
// within 1e-5 relative over 30 fp32 steps (the sums differ only in their order).
TEST(DistIntegration, ZeroTwoAndThreeTrainAsOneRankWithin1e5) {
  ScratchDir one("dist4_one");
  auto r = run_keel(tiny_args(one, 16, 30));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = losses(one);
  const std::string full = " --set model.activation_checkpointing=full";
  const std::vector<std::string> runs = {
      "launch --nproc 4 -- {} --set distributed.zero=2",
      "launch --nproc 4 -- {} --set distributed.zero=2" + full,
      "launch --nproc 4 -- {} --set distributed.zero=3",
      "launch --nproc 4 -- {} --set distributed.zero=3" + full,
      "launch --nproc 2 -- {} --set distributed.zero=2 --set data.grad_accum_steps=2",
      "launch --nproc 2 -- {} --set distributed.zero=3 --set data.grad_accum_steps=2",
      "launch --nproc 2 -- {} --set distributed.zero=2 --set data.grad_accum_steps=2" + full,
      "launch --nproc 2 -- {} --set distributed.zero=3 --set data.grad_accum_steps=2" + full};
  for (const std::string& run : runs) {
    ScratchDir d("dist4_sharded");
    const std::string args = tiny_args(d, 4, 30);
    r = run_keel(std::regex_replace(run, std::regex("\\{\\}"), args));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto b = losses(d);
    ASSERT_EQ(b.size(), a.size()) << run;
    for (const auto& [step, loss] : a)
      EXPECT_NEAR(b.at(step), loss, 1e-5 * loss) << "step " << step << ": " << run;
  }
}

TEST(DistIntegration, BothRanksTakeTheGuardsDecisionsTogetherUnderZeroTwo) {
  expect_guard_decisions_together("dist_guard_zero2", " --set distributed.zero=2");
}

// bf16 under ZeRO-3: the units are gathered in bf16, so the plan counts no autocast copies of the
// weights, and 2 ranks train as 1 rank with fp32 weights under autocast does, to bf16's
// precision (the norms' and embedding's weights are rounded too).
TEST(DistIntegration, ZeroThreeInBf16GathersBf16UnitsAndTrainsAsOneRank) {
  ScratchDir one("dist_z3_bf16_one"), two("dist_z3_bf16_two");
  const std::string bf16 = " --set run.precision=bf16";
  auto r = run_keel(tiny_args(one, 16, 20) + bf16);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 2 -- " + tiny_args(two, 8, 20) + bf16 + " --set distributed.zero=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = losses(one), b = losses(two);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, loss] : a) EXPECT_NEAR(b.at(step), loss, 2e-2 * loss) << step;
  bool planned = false;
  for (auto& e : read_jsonl(two.path() / "events.jsonl")) {
    if (e["kind"] != "memory") continue;
    planned = true;
    EXPECT_EQ(e["detail"]["plan"]["copies"].get<double>(), 0.0);
    EXPECT_GT(e["detail"]["plan"]["gathered"].get<double>(), 0.0);
  }
  EXPECT_TRUE(planned);
}

// Under ZeRO-3 the forensics of each pause hold every rank's part of the weights.
TEST(DistIntegration, BothRanksTakeTheGuardsDecisionsTogetherUnderZeroThree) {
  expect_guard_decisions_together("dist_guard_zero3", " --set distributed.zero=3");
}

// The newest record of each step: a resumed run logs again the steps after its checkpoint.
std::map<int64_t, nlohmann::json> by_step(const std::filesystem::path& file) {
  std::map<int64_t, nlohmann::json> out;
  for (auto& rec : read_jsonl(file)) out[rec["step"].get<int64_t>()] = rec;
  return out;
}

// Checkpointed at world size 2 (rank 1 crashes at iteration 25, after the checkpoint at step 20):
// resumed at 2 ranks it continues bit for bit as the uninterrupted run; resumed at 1 rank of
// micro-batch 2B it continues the same global sample order, at the same losses. `extra` is added
// to every run (ZeRO-1 or not).
void expect_resume_across_world_sizes(const std::string& name, const std::string& extra) {
  ScratchDir ref(name + "_ref"), two(name + "_two"), one(name + "_one");
  const std::string record =
      " --set logging.sample_ids=true --set checkpoint.every_steps=10" + extra;
  auto r = run_keel("launch --nproc 2 -- " + tiny_args(ref, 8, 40) + record);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 2 --grace 5 -- " + tiny_args(two, 8, 40) + record +
               " --set 'faults=[{kind: crash, at_step: 25, rank: 1}]'");
  ASSERT_NE(r.exit_code, 0) << r.output;
  std::filesystem::copy(
      two.path(), one.path(),
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  r = run_keel("launch --nproc 2 -- " + tiny_args(two, 8, 40) + record + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel(tiny_args(one, 16, 40) + record + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const auto ref_metrics = by_step(ref.path() / "metrics.jsonl");
  const auto ref_samples = by_step(ref.path() / "samples.jsonl");
  const auto two_metrics = by_step(two.path() / "metrics.jsonl");
  const auto one_metrics = by_step(one.path() / "metrics.jsonl");
  const auto one_samples = by_step(one.path() / "samples.jsonl");
  for (int64_t step = 21; step <= 40; ++step) {
    ASSERT_TRUE(ref_metrics.count(step) && two_metrics.count(step) && one_metrics.count(step))
        << step;
    const double loss = ref_metrics.at(step)["loss"].get<double>();
    EXPECT_EQ(two_metrics.at(step)["loss"].get<double>(), loss) << "2 -> 2, step " << step;
    EXPECT_NEAR(one_metrics.at(step)["loss"].get<double>(), loss, 1e-3 * loss)
        << "2 -> 1, step " << step;
    ASSERT_TRUE(ref_samples.count(step) && one_samples.count(step)) << step;
    EXPECT_EQ(one_samples.at(step)["ids"], ref_samples.at(step)["ids"]) << "2 -> 1, step " << step;
  }
}

// checkpoint.async with several ranks (issue 50): each rank copies its part to host memory and a
// writer thread saves it; the commit's barriers go through the store, not the training group.
// Under ZeRO-3 (every rank writes its part of the weights too) a run killed (SIGKILL of rank 1 at
// iteration 25) resumes at 2 ranks bit for bit and at 1 rank within 1e-3.
TEST(DistIntegration, AsyncCheckpointsOfSeveralRanksResumeBitExactly) {
  expect_resume_across_world_sizes("dist_async_z3",
                                   " --set distributed.zero=3 --set checkpoint.async=true");
}

// A rank killed (SIGKILL) while an async save is in flight: the test waits for the staging
// directory of step 10 (a 260 MB save takes about half a second here) and kills rank 1. Whichever
// the newest complete checkpoint is (step 0, or step 10 if rank 1's part was on disk and its
// commit went through before it died), LATEST names it, every committed checkpoint verifies,
// nothing half-written is committed, and the job resumes from it.
TEST(DistIntegration, ARankKilledDuringAnAsyncSaveLeavesTheNewestCompleteCheckpoint) {
  ScratchDir d("dist_async_kill");
  const std::string record =
      " --set checkpoint.every_steps=10 --set checkpoint.async=true --set model.d_model=512"
      " --set model.n_heads=8 --set model.n_layers=4";
  const auto launcher =
      start_keel_training("launch --nproc 2 --grace 5 -- " + tiny_args(d, 2, 100000) + record,
                          d.path(), d.path() / "launch.log");
  ASSERT_GT(launcher, 0);
  const auto checkpoints = d.path() / "checkpoints";
  bool in_flight = false;
  for (int i = 0; i < 6000 && !in_flight; ++i) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(checkpoints, ec))
      in_flight |= e.path().filename().string().rfind("step_00000010.tmp-", 0) == 0;
    if (!in_flight) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(in_flight) << "no save of step 10 seen in flight";
  const auto kill = run_shell(
      "for p in $(pgrep -P " + std::to_string(launcher) +
      "); do tr '\\0' '\\n' < /proc/$p/environ | grep -qx RANK=1 && kill -9 $p && echo killed; "
      "done");
  ASSERT_NE(kill.output.find("killed"), std::string::npos) << kill.output;
  for (int i = 0; i < 600 && ::kill(launcher, 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_NE(::kill(launcher, 0), 0) << "the launcher did not end";

  std::ifstream latest(checkpoints / "LATEST");
  std::string name;
  ASSERT_TRUE(latest >> name);
  EXPECT_TRUE(name == "step_00000000" || name == "step_00000010") << name;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind("step_", 0) != 0 || n.find(".tmp-") != std::string::npos) continue;
    const auto inspect = run_keel("inspect " + entry.path().string());
    EXPECT_EQ(inspect.exit_code, 0) << n << "\n" << inspect.output;
    EXPECT_NE(inspect.output.find("verify:      OK"), std::string::npos) << inspect.output;
  }
  const int64_t resumed_at = std::stoll(name.substr(5));
  auto r = run_keel("launch --nproc 2 -- " + tiny_args(d, 2, static_cast<int>(resumed_at) + 3) +
                    record + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + (checkpoints / name).string()), std::string::npos)
      << r.output;
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], resumed_at + 3);
}

// On shards the sample order depends on neither the world size nor the micro-batch size: with
// the global batch kept at 24, runs resumed from 2 ranks x 12 at 3 ranks x 8, and from 1 rank x 24
// at 2 ranks x 12, train step by step on exactly the samples the uninterrupted run trains on.
TEST(DistIntegration, OnShardsAResumeAtAnotherLayoutTrainsTheSameSamples) {
  const std::string fortunes = "/usr/share/games/fortunes/fortunes";
  if (!std::filesystem::exists(fortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  ScratchDir data("dist_layout_data"), ref("dist_layout_ref"), a("dist_layout_a"),
      b("dist_layout_b");
  auto r = run_keel("prepare --input " + fortunes + " --output " + data.str() +
                    " --separator % --seq-len 32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto args = [&](const ScratchDir& d, int micro_batch) {
    return "train --run-dir " + d.str() + kQuickRun +
           " --set data.source=shards --set data.path=" + data.str() +
           " --set model.vocab_size=264 --set data.micro_batch_size=" +
           std::to_string(micro_batch) +
           " --set run.max_steps=30 --set logging.sample_ids=true --set checkpoint.every_steps=10";
  };
  const std::string crash = " --set 'faults=[{kind: crash, at_step: 15}]'";
  r = run_keel(args(ref, 24));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 2 -- " + args(a, 12) + crash);
  ASSERT_NE(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 3 -- " + args(a, 8) + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel(args(b, 24) + crash);
  ASSERT_NE(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 2 -- " + args(b, 12) + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto expected = by_step(ref.path() / "samples.jsonl");
  for (const ScratchDir* run : {&a, &b}) {
    const auto got = by_step(run->path() / "samples.jsonl");
    for (int64_t step = 1; step <= 30; ++step) {
      ASSERT_TRUE(expected.count(step) && got.count(step)) << run->str() << " step " << step;
      EXPECT_EQ(got.at(step)["ids"], expected.at(step)["ids"]) << run->str() << " step " << step;
    }
  }
}

// ZeRO-2 writes ZeRO-1's checkpoints: any world size resumes them, and so does ZeRO-1.
TEST(DistIntegration, ZeroTwoResumesAtAnyWorldSizeAndUnderZeroOne) {
  expect_resume_across_world_sizes("dist_zero2_resume", " --set distributed.zero=2");
  ScratchDir d("dist_zero2_to_one");
  auto r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 4) + " --set distributed.zero=2" +
                    " --set checkpoint.every_steps=4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 8) + " --set distributed.zero=1" +
               " --set checkpoint.every_steps=4 --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], 8);
}

// 4 ranks with ZeRO-3 (crashing after the checkpoint of step 10) -> 2 ranks with ZeRO-1
// (crashing after step 20) -> 1 rank without ZeRO: the uninterrupted 4-rank run's losses (1e-5)
// and sample order. The ZeRO-3 checkpoint holds the weights in every rank's part, which export,
// sample and inspect read whole.
TEST(DistIntegration, ZeroThreeResumesAsZeroOneThenWithoutZeroAtFewerRanks) {
  ScratchDir ref("dist_z3_ref"), run("dist_z3_run"), hf("dist_z3_hf");
  const std::string record = " --set logging.sample_ids=true --set checkpoint.every_steps=10";
  auto r = run_keel("launch --nproc 4 -- " + tiny_args(ref, 4, 30) + record +
                    " --set distributed.zero=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 4 --grace 5 -- " + tiny_args(run, 4, 30) + record +
               " --set distributed.zero=3 --set 'faults=[{kind: crash, at_step: 15, rank: 1}]'");
  ASSERT_NE(r.exit_code, 0) << r.output;
  const auto step10 = run.path() / "checkpoints" / "step_00000010";
  EXPECT_TRUE(std::filesystem::exists(step10 / "model.rank3.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(step10 / "model.safetensors"));
  r = run_keel("inspect " + step10.string());
  EXPECT_NE(r.output.find("(in 4 parts)"), std::string::npos) << r.output;
  r = run_keel("export --format hf " + step10.string() + " --out " + hf.str() + "/out");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(hf.path() / "out" / "model.safetensors"));
  r = run_keel("sample " + step10.string() + " --prompt '1 2 3' --tokens 4 --seed 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // --init-from under ZeRO-3: each rank reads the Hugging Face tensors unit by unit as it shards
  // them; 2 ranks start from the weights 1 rank starts from (trained ones: a lower first loss than
  // a fresh model's) and train as it does.
  ScratchDir from_one("dist_z3_init_one"), from_two("dist_z3_init_two");
  const std::string init = " --init-from " + hf.str() + "/out";
  r = run_keel(tiny_args(from_one, 16, 10) + init);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 2 -- " + tiny_args(from_two, 8, 10) + init +
               " --set distributed.zero=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto init_one = losses(from_one), init_two = losses(from_two), fresh = losses(ref);
  ASSERT_EQ(init_one.size(), init_two.size());
  for (const auto& [step, loss] : init_one)
    EXPECT_NEAR(init_two.at(step), loss, 1e-5 * loss) << "--init-from, step " << step;
  EXPECT_LT(init_one.at(1), fresh.at(1) - 0.1);

  r = run_keel("launch --nproc 2 --grace 5 -- " + tiny_args(run, 8, 30) + record +
               " --set distributed.zero=1 --set 'faults=[{kind: crash, at_step: 25, rank: 1}]'"
               " --resume latest");
  ASSERT_NE(r.exit_code, 0) << r.output;
  r = run_keel(tiny_args(run, 16, 30) + record + " --set distributed.zero=0 --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto ref_metrics = by_step(ref.path() / "metrics.jsonl");
  const auto ref_samples = by_step(ref.path() / "samples.jsonl");
  const auto metrics = by_step(run.path() / "metrics.jsonl");
  const auto samples = by_step(run.path() / "samples.jsonl");
  for (int64_t step = 1; step <= 30; ++step) {
    ASSERT_TRUE(ref_metrics.count(step) && metrics.count(step)) << step;
    const double loss = ref_metrics.at(step)["loss"].get<double>();
    EXPECT_NEAR(metrics.at(step)["loss"].get<double>(), loss, 1e-5 * loss) << "step " << step;
    ASSERT_TRUE(ref_samples.count(step) && samples.count(step)) << step;
    EXPECT_EQ(samples.at(step)["ids"], ref_samples.at(step)["ids"]) << "step " << step;
  }
}

TEST(DistIntegration, ResumeAtTheSameOrAnotherWorldSize) {
  expect_resume_across_world_sizes("dist_resume", "");
}

// ZeRO-1's checkpoints hold one part of the optimizer state per rank (the manifest says so); a
// resume at 2 ranks reads its own part, at 1 rank both parts. At the same world size, ZeRO-3
// (whose parts are cut by unit, not by bucket) and a run without ZeRO read every part.
TEST(DistIntegration, ZeroOneShardsTheOptimizerStateAndResumesAtAnyWorldSize) {
  expect_resume_across_world_sizes("dist_zero_resume", " --set distributed.zero=1");

  ScratchDir d("dist_zero_files");
  auto r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 4) + " --set distributed.zero=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto ckpt = d.path() / "checkpoints" / "step_00000004";
  std::ifstream manifest_file(ckpt / "MANIFEST.json");
  const auto manifest = nlohmann::json::parse(manifest_file);
  EXPECT_EQ(manifest["optimizer_sharded"], true);
  const auto model = std::filesystem::file_size(ckpt / "model.safetensors");
  for (const char* part : {"optimizer.rank0.safetensors", "optimizer.rank1.safetensors"}) {
    const auto size = std::filesystem::file_size(ckpt / part);  // AdamW: 2 moments, half each
    EXPECT_GT(size, model * 9 / 10) << part;
    EXPECT_LT(size, model * 11 / 10) << part;
  }
  r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 6) + " --set distributed.zero=3" +
               " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 8) + " --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel(tiny_args(d, 16, 10) + " --set distributed.zero=1 --resume latest");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], 10);
}

// A rank that dies (SIGKILL at iteration 5) makes the job end, promptly and naming it: the other
// rank's collective fails or the launcher stops it, and every process is gone.
TEST(DistIntegration, ARankThatDiesEndsTheJobNamingIt) {
  ScratchDir d("dist_death");
  const auto start = std::chrono::steady_clock::now();
  auto r = run_keel("launch --nproc 2 --grace 5 -- " + tiny_args(d, 8, 50) +
                    " --set distributed.timeout_s=20"
                    " --set 'faults=[{kind: crash, at_step: 5, rank: 1}]'");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited first"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 20 + 30) << r.output;
}

// When the line of `log` that contains `marker` was written (its timestamp), if there is one.
std::optional<std::chrono::system_clock::time_point> logged_at(const std::string& log,
                                                               const std::string& marker) {
  const size_t at = log.find(marker);
  if (at == std::string::npos) return std::nullopt;
  const size_t newline = log.rfind('\n', at);
  const std::string line = log.substr(newline == std::string::npos ? 0 : newline + 1);
  static const std::regex stamp(R"((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{3}))");
  std::smatch m;
  if (!std::regex_search(line, m, stamp)) return std::nullopt;
  std::tm tm{};
  std::istringstream(m[1].str()) >> std::get_time(&tm, "%Y-%m-%d %H:%M:%S");
  tm.tm_isdst = -1;  // the log's local time, daylight saving or not
  return std::chrono::system_clock::from_time_t(std::mktime(&tm)) +
         std::chrono::milliseconds(std::stoi(m[2].str()));
}

// Stragglers (issue 50): a rank made slower by 40 ms a step (the slow_rank fault) is named in one
// warn once it has been the slowest in 5 logged windows in a row, and every logged step carries the
// slowest rank and its lag; the same job without the fault warns of no straggler.
TEST(DistIntegration, ASlowRankIsNamedAsTheStraggler) {
  ScratchDir slow("dist_straggler"), clean("dist_no_straggler");
  auto r = run_keel("launch --nproc 2 -- " + tiny_args(slow, 8, 30) +
                    " --set 'faults=[{kind: slow_rank, rank: 1, seconds: 0.04, at_step: 1, "
                    "steps: 1000}]'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int warns = 0;
  for (auto& e : read_jsonl(slow.path() / "events.jsonl"))
    if (e["kind"] == "warn" && e["detail"]["signal"] == "straggler") {
      ++warns;
      EXPECT_EQ(e["detail"]["rank"], 1) << e;
      EXPECT_GE(e["detail"]["lag_ms"].get<double>(), 30.0) << e;
    }
  EXPECT_EQ(warns, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1 is the slowest rank in 5 logged windows in a row"),
            std::string::npos)
      << r.output;
  const auto metrics = read_jsonl(slow.path() / "metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  EXPECT_EQ(metrics.back()["slowest_rank"], 1);
  EXPECT_GE(metrics.back()["rank_lag_ms"].get<double>(), 30.0);

  r = run_keel("launch --nproc 2 -- " + tiny_args(clean, 8, 30));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (auto& e : read_jsonl(clean.path() / "events.jsonl"))
    EXPECT_FALSE(e["kind"] == "warn" && e["detail"]["signal"] == "straggler") << e;
}

// A rank that hangs (alive, silent, deaf to SIGTERM) ends the job within distributed.timeout_s
// + 5 s of the hang, and the others name it: rank 1, and rank 0, which hosts the store.
TEST(DistIntegration, AHungRankEndsTheJobWithinTheTimeoutNamingIt) {
  for (const int hung : {1, 0}) {
    SCOPED_TRACE("hung rank " + std::to_string(hung));
    ScratchDir d("dist_hang");
    auto r = run_keel("launch --nproc 2 -- " + tiny_args(d, 8, 50) +
                      " --set distributed.timeout_s=10 --set 'faults=[{kind: hang, at_step: 5, "
                      "rank: " +
                      std::to_string(hung) + "}]'");
    const auto ended = std::chrono::system_clock::now();
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_NE(r.output.find("rank " + std::to_string(hung) + " stopped answering"),
              std::string::npos)
        << r.output;
    const auto hung_at = logged_at(r.output, "hang fault at iteration 5");
    ASSERT_TRUE(hung_at.has_value()) << r.output;
    EXPECT_LT(std::chrono::duration<double>(ended - *hung_at).count(), 10 + 5) << r.output;
  }
}

// A scheduler's SIGTERM to the launcher reaches every rank; they agree on the step, write one
// checkpoint together and exit.
TEST(DistIntegration, SigtermToTheLauncherCheckpointsOnceOnEveryRank) {
  ScratchDir d("dist_sigterm");
  const int pid = start_keel_training("launch --nproc 2 -- " + tiny_args(d, 8, 100000), d.path(),
                                      d.path() / "log");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  for (int i = 0; i < 600 && ::kill(pid, 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_NE(::kill(pid, 0), 0) << "the launcher is still running";
  std::ifstream log_file(d.path() / "log");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  const auto events = read_jsonl(d.path() / "events.jsonl");
  ASSERT_FALSE(events.empty()) << log;
  EXPECT_EQ(events.back()["kind"], "interrupted") << log;
  const int64_t stopped_at = events.back()["step"].get<int64_t>();
  int checkpoints = 0;
  for (auto& e : events) checkpoints += e["kind"] == "checkpoint" && e["step"] == stopped_at;
  EXPECT_EQ(checkpoints, 1) << log;
  const auto dir = d.path() / "checkpoints" / ("step_" + fmt_step(stopped_at));
  for (const char* f : {"optimizer.rank0.safetensors", "optimizer.rank1.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << dir / f << "\n" << log;
  for (const char* rank : {"[rank 0]", "[rank 1]"})
    EXPECT_NE(log.find(std::string(rank) + " "), std::string::npos) << log;
}

// Whether process `pid` still runs (a zombie that no one reaped has ended).
bool running(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// A launcher killed with SIGKILL cannot stop its ranks; the kernel does (PR_SET_PDEATHSIG): no
// rank is alive 5 s later.
TEST(DistIntegration, RanksDieWithAKilledLauncher) {
  ScratchDir d("dist_launcher_killed");
  const int pid = start_keel_training("launch --nproc 2 -- " + tiny_args(d, 8, 100000), d.path(),
                                      d.path() / "log");
  ASSERT_GT(pid, 0);
  std::vector<int> ranks;
  std::istringstream children(run_shell("pgrep -P " + std::to_string(pid)).output);
  for (int child; children >> child;) ranks.push_back(child);
  ASSERT_EQ(ranks.size(), 2u) << "the launcher's children";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  auto any_running = [&] {
    for (int rank : ranks)
      if (running(rank)) return true;
    return false;
  };
  while (any_running() && std::chrono::steady_clock::now() - killed < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(any_running()) << "a rank outlived its launcher by 5 s";
  for (int rank : ranks)
    if (running(rank)) ::kill(rank, SIGKILL);  // nothing left behind for the next test
}

// One rank started by a launcher, with a backend named in the config, makes that process group and
// runs its collectives (how scripts/gpu_check.sh checks NCCL on one GPU); the same training as one
// process without a group, to the bit. With backend auto one rank makes no group.
TEST(DistIntegration, OneLaunchedRankWithANamedBackendRunsItsCollectives) {
  ScratchDir plain("dist_plain"), group("dist_group"), autoGroup("dist_auto");
  auto a = run_keel(tiny_args(plain, 8, 20));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b = run_keel("launch --nproc 1 -- " + tiny_args(group, 8, 20) +
                    " --set distributed.backend=gloo");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("rank 0 of 1 (0 from torchrun), gloo over 127.0.0.1"), std::string::npos)
      << b.output;
  EXPECT_NE(b.output.find("gradients all-reduced in "), std::string::npos) << b.output;
  const auto x = losses(plain), y = losses(group);
  ASSERT_EQ(x.size(), 20u);
  ASSERT_EQ(y.size(), 20u);
  for (const auto& [step, loss] : x) EXPECT_EQ(y.at(step), loss) << "step " << step;
  for (auto& m : read_jsonl(group.path() / "metrics.jsonl")) EXPECT_TRUE(m.contains("comm_ms"));

  auto c = run_keel("launch --nproc 1 -- " + tiny_args(autoGroup, 8, 3));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(c.output.find(" over 127.0.0.1"), std::string::npos) << c.output;
  for (auto& m : read_jsonl(autoGroup.path() / "metrics.jsonl"))
    EXPECT_FALSE(m.contains("comm_ms"));
}

// A rank's place comes from its launcher's variables: one that is missing, or a rendezvous port
// another process holds, is the user's to fix (exit 2, naming it), never a hang.
TEST(DistIntegration, AMissingVariableOrABusyPortExitsTwoNamingIt) {
  ScratchDir d("dist_env");
  auto r = run_shell("env RANK=0 WORLD_SIZE=2 " + std::string(keel::testing::kKeelBinary) + " " +
                     tiny_args(d, 8, 5));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("MASTER_ADDR"), std::string::npos) << r.output;

  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  r = run_shell("env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " +
                std::string(keel::testing::kKeelBinary) + " " + tiny_args(d, 8, 5) +
                " --set distributed.timeout_s=10");
  ::close(fd);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(port), std::string::npos) << r.output;
}

// torchrun --no-python starts keel directly; its agent hosts the store. Same losses as launch.
TEST(DistIntegration, TorchrunStartsTheSameJob) {
  const std::string torchrun = setup_env_program("torchrun");
  if (torchrun.empty()) GTEST_SKIP() << "torchrun not found in the set-up's environment";
  ScratchDir viaLaunch("dist_launch"), viaTorchrun("dist_torchrun");
  auto a = run_keel("launch --nproc 2 -- " + tiny_args(viaLaunch, 8, 20));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  const CommandResult b = run_shell(
      torchrun + " --no-python --nproc_per_node 2 --master_addr 127.0.0.1" + " --master_port " +
      port + " " + keel::testing::kKeelBinary + " " + tiny_args(viaTorchrun, 8, 20));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  expect_same_losses(losses(viaLaunch), losses(viaTorchrun));
}

}  // namespace
}  // namespace keel::testing
