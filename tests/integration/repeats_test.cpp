// Repeated data and the fp16 loss scale's trend, under the embedded defaults with only the fault
// (and what the test reads) added: the seed's §3.2 (the same documents coming back) and §2.3
// (watch the loss scale's trend).
#include <gtest/gtest.h>

#include <set>

#include "harness.h"

namespace keel::testing {
namespace {

std::string defaults(const ScratchDir& d, int64_t steps, const std::string& extra = "") {
  return "train --run-dir " + d.str() + " --set run.max_steps=" + std::to_string(steps) +
         " --set logging.progress=off --set logging.sample_ids=true " + extra;
}

std::vector<nlohmann::json> warns(const ScratchDir& d, const std::string& signal) {
  std::vector<nlohmann::json> out;
  for (auto& e : read_jsonl(d.path() / "events.jsonl"))
    if (e["kind"] == "warn" && e["detail"].value("signal", "") == signal) out.push_back(e);
  return out;
}

// tiny: 16 samples a step, synthetic ids position x 16 + b. The set is step 60's samples.
const std::string kRepeatFault =
    " --set 'faults=[{kind: repeat_data, at_step: 60, steps: 80, period: 10}]'";

TEST(RepeatsIntegration, RepeatedDataIsNamedAtItsFirstReturnAndACleanRunIsQuiet) {
  ScratchDir clean("repeats_clean"), d("repeats_warn");
  auto c = run_keel(defaults(clean, 160));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (const char* signal : {"repeated_data", "low_loss", "loss_periodicity"})
    EXPECT_TRUE(warns(clean, signal).empty()) << signal;

  auto r = run_keel(defaults(d, 160, kRepeatFault));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto found = warns(d, "repeated_data");
  ASSERT_FALSE(found.empty()) << r.output;
  EXPECT_EQ(found.front()["step"], 70);  // the set's first return: within one period
  const auto& named = found.front()["detail"]["top_samples"];
  ASSERT_FALSE(named.empty());
  for (const auto& s : named) {
    const int64_t first = s["duplicate_of"].get<int64_t>();
    EXPECT_GE(first, 60 * 16) << s.dump();
    EXPECT_LT(first, 61 * 16) << s.dump();
    EXPECT_GE(s["id"].get<int64_t>(), 70 * 16) << s.dump();  // the positions it displaced
  }
  EXPECT_NE(r.output.find("repeat the tokens"), std::string::npos);  // on the console too
  // Warn only (the default): nothing was set aside for it.
  for (auto& q : read_jsonl(d.path() / "quarantine.jsonl"))
    EXPECT_NE(q["reason"], "repeated_data") << q.dump();
}

TEST(RepeatsIntegration, ScreenLowQuarantineSetsTheRepeatsAside) {
  ScratchDir d("repeats_quarantine");
  auto r = run_keel(defaults(d, 160, kRepeatFault + " --set stability.screen.low=quarantine"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<int64_t> repeated;
  for (auto& q : read_jsonl(d.path() / "quarantine.jsonl"))
    if (q["reason"] == "repeated_data") {
      repeated.insert(q["id"].get<int64_t>());
      EXPECT_GE(q["duplicate_of"].get<int64_t>(), 60 * 16) << q.dump();
      EXPECT_LT(q["duplicate_of"].get<int64_t>(), 61 * 16) << q.dump();
    }
  // Every return (steps 70, 80, ... 130) of all 16 samples, and nothing else.
  std::set<int64_t> expected;
  for (int64_t step = 70; step < 140; step += 10)
    for (int64_t b = 0; b < 16; ++b) expected.insert(step * 16 + b);
  EXPECT_EQ(repeated, expected);
  EXPECT_FALSE(warns(d, "repeated_data").empty());
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], 160);
}

// fp16 on the CPU is slow: a small model. The initial scale is far too high, so start-up
// calibrates it to the edge of fp16's range, where the gradients' growth pushes it down.
std::string fp16(const ScratchDir& d, const std::string& extra) {
  return defaults(d, 150,
                  "--set run.precision=fp16 --set run.fp16_initial_scale=4.0e9"
                  " --set model.d_model=64 --set model.seq_len=32 --set data.micro_batch_size=8"
                  " --set stability.median_window=20 --set eval.every_steps=0 " +
                      extra);
}

TEST(RepeatsIntegration, TheLossScaleTrendFiresOnASlowDeclineAndNotOnACleanRun) {
  ScratchDir clean("scale_clean"), d("scale_growth");
  auto c = run_keel(fp16(clean, ""));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(warns(clean, "loss_scale_trend").empty());
  EXPECT_TRUE(warns(clean, "loss_scale").empty());
  // 64x over 120 steps: a halving every 20 steps, never three within the 20-step window.
  auto r = run_keel(
      fp16(d, "--set 'faults=[{kind: grad_growth, at_step: 30, steps: 120, factor: 64}]'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto trend = warns(d, "loss_scale_trend");
  ASSERT_FALSE(trend.empty()) << r.output;
  EXPECT_GE(trend.front()["detail"]["halvings"].get<double>(), 3.0);
  EXPECT_TRUE(warns(d, "loss_scale").empty());
  const auto metrics = read_jsonl(d.path() / "metrics.jsonl");
  EXPECT_LT(metrics.back()["loss_scale"].get<double>(),
            read_jsonl(clean.path() / "metrics.jsonl").back()["loss_scale"].get<double>() / 8);
}

}  // namespace
}  // namespace keel::testing
