// Dynamic gradient accumulation through the real binary: the count moves, every sample is
// accounted for, lr follows the sqrt rule, a kill -9 and a resume continue bit for bit, and the
// consumed-vs-steps check still stops a run that loses data.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <map>

#include "harness.h"

namespace keel::testing {
namespace {

const std::string kDynamic =
    " --set data.grad_accum=dynamic --set data.grad_accum_steps=2 --set data.grad_accum_min=1"
    " --set data.grad_accum_max=4 --set data.micro_batch_size=4";

// The synthetic chain's gradient norm is flat: an lr spike (6x for 15 steps from step 60) raises
// it by about half, which is the change the count follows (below every alarm).
const std::string kSpike = "{kind: lr_spike, factor: 6, at_step: 60, steps: 15}";

std::string base_run(const std::string& extra, const std::string& more_faults = "") {
  return "train " + source_path("configs/tiny.yaml") + kQuickRun +
         " --set run.max_steps=140 --set checkpoint.every_steps=50 --set 'faults=[" + kSpike +
         more_faults + "]'" + extra;
}

std::map<int64_t, nlohmann::json> metrics_by_step(const std::filesystem::path& run_dir) {
  std::map<int64_t, nlohmann::json> out;
  for (auto& m : read_jsonl(run_dir / "metrics.jsonl")) out[m["step"].get<int64_t>()] = m;
  return out;
}

std::vector<nlohmann::json> events_of(const std::filesystem::path& run_dir,
                                      const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (auto& e : read_jsonl(run_dir / "events.jsonl"))
    if (e["kind"] == kind) out.push_back(e);
  return out;
}

TEST(AccumulationIntegration, DynamicCountKeepsAccountingAndLrAndResumesBitExact) {
  ScratchDir fixed("accum_fixed"), a("accum_dyn_a"), b("accum_dyn_b");
  auto rf = run_keel(base_run(" --set data.grad_accum_steps=2 --set data.micro_batch_size=4") +
                     " --run-dir " + fixed.str());
  ASSERT_EQ(rf.exit_code, 0) << rf.output;
  auto ra = run_keel(base_run(kDynamic) + " --run-dir " + a.str());
  ASSERT_EQ(ra.exit_code, 0) << ra.output;

  // The count moved, each time by one, within [1, 4], announced as it did; no step was refused.
  const auto changes = events_of(a.path(), "grad_accum");
  ASSERT_FALSE(changes.empty()) << ra.output;
  EXPECT_TRUE(events_of(a.path(), "pause").empty());
  EXPECT_TRUE(events_of(a.path(), "skip_nan").empty());
  for (const auto& e : changes) {
    const int64_t from = e["detail"]["from"], to = e["detail"]["to"];
    EXPECT_EQ(std::abs(to - from), 1);
    EXPECT_GE(to, 1);
    EXPECT_LE(to, 4);
  }
  // Every sample taken is a sample trained on: the steps' counts add up to samples_seen.
  const auto ma = metrics_by_step(a.path()), mf = metrics_by_step(fixed.path());
  ASSERT_EQ(ma.size(), 140u);
  int64_t micro = 0;
  bool moved = false;
  for (const auto& [step, m] : ma) {
    const int64_t k = m.at("grad_accum");
    micro += k;
    moved |= k != 2;
    EXPECT_EQ(m["samples_seen"].get<int64_t>(), micro * 4) << "step " << step;
    // lr: the schedule's, times sqrt(k / 2).
    const double expected = mf.at(step)["lr"].get<double>() * std::sqrt(k / 2.0);
    EXPECT_NEAR(m["lr"].get<double>(), expected, 1e-12 * expected) << "step " << step;
  }
  EXPECT_TRUE(moved);

  // Killed after the checkpoint at step 100 and resumed: the same counts and losses, bit for bit.
  auto rb = run_keel(base_run(kDynamic, ", {kind: crash, at_step: 120}") + " --run-dir " + b.str());
  ASSERT_EQ(rb.exit_code, 128 + 9) << rb.output;
  auto rc = run_keel(base_run(kDynamic) + " --run-dir " + b.str() + " --resume latest");
  ASSERT_EQ(rc.exit_code, 0) << rc.output;
  const auto mb = metrics_by_step(b.path());
  ASSERT_EQ(mb.size(), 140u);
  for (const auto& [step, m] : ma) {
    EXPECT_EQ(m["grad_accum"], mb.at(step)["grad_accum"]) << "step " << step;
    EXPECT_EQ(std::bit_cast<uint64_t>(m["loss"].get<double>()),
              std::bit_cast<uint64_t>(mb.at(step)["loss"].get<double>()))
        << "step " << step;
  }
}

TEST(AccumulationIntegration, DynamicNeedsARangeAndTheGuard) {
  const std::string cfg = source_path("configs/tiny.yaml");
  auto narrow = run_keel("validate " + cfg +
                         " --set data.grad_accum=dynamic --set data.grad_accum_steps=2"
                         " --set data.grad_accum_min=3");
  EXPECT_EQ(narrow.exit_code, 2) << narrow.output;
  EXPECT_NE(narrow.output.find("data.grad_accum_min"), std::string::npos) << narrow.output;
  auto unguarded =
      run_keel("validate " + cfg + " --set data.grad_accum=dynamic --set stability.enabled=false");
  EXPECT_EQ(unguarded.exit_code, 2) << unguarded.output;
  EXPECT_NE(unguarded.output.find("stability.enabled"), std::string::npos) << unguarded.output;
}

}  // namespace
}  // namespace keel::testing
