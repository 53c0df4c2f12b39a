// Defences on by default: a bad data region, many incidents, the quarantine record, fp16 start-up
// overflows, prepare's and validate's defaults — each run under the embedded defaults with only
// the fault (and the measurement switches) added, as a user who launches keel gets them.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "harness.h"

namespace keel::testing {
namespace {

const char* kFortunes = "/usr/share/games/fortunes/fortunes";

// The embedded defaults plus what the test reads: sample ids, a quiet progress line, a precise
// enough val loss. Nothing that changes training.
std::string defaults(const ScratchDir& d, int64_t steps, const std::string& extra = "") {
  return "train --run-dir " + d.str() + " --set run.max_steps=" + std::to_string(steps) +
         " --set logging.progress=off --set logging.sample_ids=true --set eval.batches=8 " + extra;
}

double final_val(const ScratchDir& d) {
  return read_jsonl(d.path() / "eval.jsonl").back()["val_loss"].get<double>();
}

std::map<int64_t, int> rollbacks_per_incident(const ScratchDir& d) {
  std::map<int64_t, int> out;
  for (auto& e : read_jsonl(d.path() / "events.jsonl"))
    if (e["kind"] == "rollback") ++out[e["detail"]["incident"].get<int64_t>()];
  return out;
}

// Samples are trained on at most once, and a quarantined sample never after it was set aside.
void expect_exact_data_accounting(const ScratchDir& d) {
  std::map<int64_t, int64_t> quarantined;  // id -> iteration it was set aside at
  for (auto& q : read_jsonl(d.path() / "quarantine.jsonl"))
    quarantined.emplace(q["id"].get<int64_t>(), q["iteration"].get<int64_t>());
  std::set<int64_t> seen;
  for (auto& rec : read_jsonl(d.path() / "samples.jsonl")) {
    const int64_t iteration = rec["iteration"].get<int64_t>();
    for (auto& id : rec["ids"]) {
      EXPECT_TRUE(seen.insert(id.get<int64_t>()).second) << "sample " << id << " served twice";
      auto it = quarantined.find(id.get<int64_t>());
      if (it != quarantined.end())
        EXPECT_LE(iteration, it->second) << "sample " << id << " trained on after quarantine";
    }
  }
}

// A quarter of the run is garbage, in one contiguous region. The first bad step rolls back once;
// the screen masks the rest sample by sample, every bad sample is set aside, and the run ends
// where a clean run does.
TEST(DefencesIntegration, ALongBadRegionUnderDefaultsCostsAtMostTwoRollbacks) {
  ScratchDir clean("defences_clean"), bad("defences_region");
  auto c = run_keel(defaults(clean, 160));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  auto r = run_keel(defaults(
      bad, 160,
      "--set 'faults=[{kind: corrupt_batch, mode: random_tokens, at_step: 80, steps: 40}]'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (auto& [incident, n] : rollbacks_per_incident(bad))
    EXPECT_LE(n, 2) << "incident " << incident;
  // Synthetic ids are position x 16 + b: the region holds ids [80 x 16, 120 x 16).
  std::set<int64_t> quarantined;
  for (auto& q : read_jsonl(bad.path() / "quarantine.jsonl")) {
    quarantined.insert(q["id"].get<int64_t>());
    EXPECT_TRUE(q.contains("reason") && q.contains("step") && q.contains("iteration")) << q.dump();
  }
  for (int64_t id = 80 * 16; id < 120 * 16; ++id)
    ASSERT_TRUE(quarantined.count(id)) << "bad sample " << id << " was not set aside";
  expect_exact_data_accounting(bad);
  EXPECT_NEAR(final_val(bad), final_val(clean), 0.02 * final_val(clean));
  EXPECT_EQ(read_jsonl(bad.path() / "metrics.jsonl").back()["step"], 160);
}

// Ten incidents of every kind spread over one run: the rollback budget is per incident and a
// rate, so the run finishes, where a clean run does.
TEST(DefencesIntegration, TenIncidentsInOneRunFinish) {
  ScratchDir clean("defences_ten_clean"), d("defences_ten");
  auto c = run_keel(defaults(clean, 300));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  auto r = run_keel(defaults(d, 300, kTenIncidentFaults));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (auto& [incident, n] : rollbacks_per_incident(d)) EXPECT_LE(n, 2) << "incident " << incident;
  int alarms = 0;
  for (auto& e : read_jsonl(d.path() / "events.jsonl")) {
    EXPECT_NE(e["kind"], "abort") << e.dump();
    alarms += e["kind"] == "screen" || e["kind"] == "pause" || e["kind"] == "skip_nan";
  }
  EXPECT_GE(alarms, 5);  // early, still-uncertain steps shrug some of the bad data off
  expect_exact_data_accounting(d);
  EXPECT_EQ(read_jsonl(d.path() / "metrics.jsonl").back()["step"], 300);
  EXPECT_NEAR(final_val(d), final_val(clean), 0.02 * final_val(clean));
}

// fp16's start-up overflows (an initial loss scale far too high) are the scaler calibrating:
// `overflow` events, never a NaN incident or a rollback.
TEST(DefencesIntegration, Fp16StartUpOverflowsAreNoIncident) {
  ScratchDir d("defences_fp16");
  // fp16 autocast on the CPU is slow: a small model, few steps.
  auto r = run_keel(defaults(d, 20,
                             "--set run.precision=fp16 --set run.fp16_initial_scale=4.0e9"
                             " --set model.d_model=64 --set model.seq_len=32"
                             " --set schedule.warmup_steps=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int overflows = 0;
  for (auto& e : read_jsonl(d.path() / "events.jsonl")) {
    overflows += e["kind"] == "overflow";
    EXPECT_NE(e["kind"], "skip_nan") << e.dump();
    EXPECT_NE(e["kind"], "pause") << e.dump();
    EXPECT_NE(e["kind"], "rollback") << e.dump();
  }
  EXPECT_GE(overflows, 5);
  auto metrics = read_jsonl(d.path() / "metrics.jsonl");
  EXPECT_EQ(metrics.back()["step"], 20);
  EXPECT_LT(metrics.back()["loss_scale"].get<double>(), 4.0e9);
}

class DefencesOnShards : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kFortunes))
      GTEST_SKIP() << "the fortunes package is not installed";
    // keel prepare's defaults alone (plus how to split this corpus and the window length).
    auto r = run_keel(std::string("prepare --input ") + kFortunes + " --output " + data() +
                      " --separator % --seq-len 64");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::string data() const { return (dir_.path() / "data").string(); }
  ScratchDir dir_{"defences_shards"};
};

// The seed's prepare defaults: a val split, length tails dropped, a tenth kept whole.
TEST_F(DefencesOnShards, PrepareDefaultsFollowTheSeed) {
  std::ifstream in(dir_.path() / "data/report.json");
  const auto report = nlohmann::json::parse(in);
  EXPECT_GT(report["splits"]["val"]["documents"].get<int64_t>(), 0) << report.dump();
  EXPECT_DOUBLE_EQ(report["length_filter"]["drop_percentile_tails"].get<double>(), 0.5);
  EXPECT_GT(report["length_filter"]["removed"]["high_tail"].get<int64_t>(), 0);
  EXPECT_DOUBLE_EQ(report["packing"]["keep_whole"].get<double>(), 0.1);
  EXPECT_GT(report["packing"]["documents_kept_whole"].get<int64_t>(), 0);
}

// The embedded config trains on the shards with vocab_size auto (the data's 257, padded to 320),
// and a bad region's quarantine records say where each sample lives in the data.
TEST_F(DefencesOnShards, QuarantineRecordsNameTheShardAndOffset) {
  ScratchDir d("defences_shards_run");
  auto r = run_keel(defaults(d, 60,
                             "--set data.source=shards --set data.path=" + data() +
                                 " --set model.vocab_size=auto --set model.seq_len=64"
                                 " --set 'faults=[{kind: corrupt_batch, mode: random_tokens, "
                                 "at_step: 40, steps: 3}]'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto quarantine = read_jsonl(d.path() / "quarantine.jsonl");
  ASSERT_GE(quarantine.size(), 3u * 16u);
  for (auto& q : quarantine) {
    ASSERT_TRUE(q.contains("shard") && q.contains("offset") && q.contains("doc_id")) << q.dump();
    EXPECT_NE(q["shard"].get<std::string>().find("train_"), std::string::npos) << q.dump();
    EXPECT_GE(q["offset"].get<int64_t>(), 0);
  }
  std::ifstream resolved(d.path() / "config.resolved.yaml");
  std::string text((std::istreambuf_iterator<char>(resolved)), {});
  EXPECT_NE(text.find("vocab_size: 320"), std::string::npos);
  // The data statistics of a logged step: per-sample losses, document lengths, the bucket mix.
  auto m = read_jsonl(d.path() / "metrics.jsonl").back();
  for (const char* k : {"sample_loss", "doc_len", "bucket_mix", "grad_norm_layers", "clip_rate"})
    EXPECT_TRUE(m.contains(k)) << k << " missing from " << m.dump();
}

// A quarantined sample names the raw record it came from: the JSONL file, the record's line and its
// id field (the fortunes as JSONL, one record per line, so record k is on line k + 1); the report
// lists it.
TEST(DefencesProvenance, QuarantineNamesTheJsonlFileLineAndId) {
  if (!std::filesystem::exists(kFortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  ScratchDir d("provenance_jsonl");
  ASSERT_GT(write_fortunes_jsonl(kFortunes, d.path() / "fortunes.jsonl"), 300);
  const std::string input = d / "fortunes.jsonl", data = d / "data";
  auto r = run_keel("prepare --input " + input + " --output " + data + " --seq-len 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ScratchDir run("provenance_jsonl_run");
  const auto quarantine = quarantine_of_a_bad_region(data, run.path());
  ASSERT_GE(quarantine.size(), 16u);
  for (const auto& q : quarantine) {
    ASSERT_TRUE(q.contains("source")) << q.dump();
    const auto& source = q["source"];
    EXPECT_EQ(source["file"], input) << q.dump();
    const int64_t doc_id = q["doc_id"].get<int64_t>();
    EXPECT_EQ(source["line"].get<int64_t>(), doc_id + 1) << q.dump();
    EXPECT_EQ(source["id"], "fortune-" + std::to_string(doc_id)) << q.dump();
  }
  r = run_keel("report " + run.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream html(run.path() / "report.html");
  const std::string page((std::istreambuf_iterator<char>(html)), {});
  const auto& first = quarantine.front()["source"];
  EXPECT_NE(page.find(input + ":" + std::to_string(first["line"].get<int64_t>()) + " id " +
                      first["id"].get<std::string>()),
            std::string::npos);
}

// keel validate walks the seed's checklist item by item and warns where an item is off.
TEST(DefencesIntegration, ValidateWalksTheChecklist) {
  auto ok = run_keel("validate --no-probe");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  for (const char* item : {"optimizer", "beta2", "gradient clipping", "mixed precision", "dedup",
                           "cross-cluster sampling", "backpressure", "warmup", "lr decay by step",
                           "two-level alarm", "checkpoint contents", "stable snapshots"})
    EXPECT_NE(ok.output.find(std::string("] ") + item + ":"), std::string::npos) << item;
  EXPECT_NE(ok.output.find("[ok  ] two-level alarm"), std::string::npos) << ok.output;
  auto off = run_keel(
      "validate --no-probe --set 'optim.betas=[0.9, 0.999]'"
      " --set stability.enabled=false");
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_NE(off.output.find("[WARN] beta2"), std::string::npos) << off.output;
  EXPECT_NE(off.output.find("[OFF ] two-level alarm"), std::string::npos) << off.output;
}

// keel validate on the production config with a prepared dataset: every checklist item with the
// evidence it used (the lock, the dataset's checksums and report, dedup's passes, the loader
// reading the real source).
TEST_F(DefencesOnShards, ValidateShowsTheEvidenceOfEachChecklistItem) {
  auto r =
      run_keel("validate " + source_path("configs/production-124m.yaml") +
               " --no-probe --no-disk-check --set data.source=shards --set data.path=" + data());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = {
      "[ok  ] config locked: production.locked", "[ok  ] data verified: " + data() + ": ",
      "[ok  ] dedup: keel prepare removed",
      "[ok  ] backpressure: ", "[n/a ] rollback rehearsed: not run here"};
  for (const std::string& line : lines)
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  EXPECT_NE(r.output.find("every file is there at its size; prepare's report.json is there"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("loader worker(s) read " + data()), std::string::npos) << r.output;
}

// keel validate --rehearse: a short run of the config's own model on this machine through a
// device's wrong gradient, a bad batch and an lr spike, reported as a machine fault and pause ->
// rollback -> recovery, in under a minute on tiny; with the defences off it says what did not
// happen, and exits 1.
TEST(DefencesIntegration, ValidateRehearseRollsBackAndRecovers) {
  const auto start = std::chrono::steady_clock::now();
  auto r = run_keel("validate --no-probe --rehearse");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[ok  ] rollback rehearsed: 90 steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rollback(s) to a stable snapshot"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the wrong gradient named as a machine fault"), std::string::npos)
      << r.output;
  // The schedule at the configured peak: quiet, and the probes name the peak that would not be.
  EXPECT_NE(r.output.find("[ok  ] lr against the model: at the configured peak 0.003 the "
                          "attention output grew at most"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex("it would not stay quiet at [0-9.e-]+ \\([0-9.]+x the peak")))
      << r.output;
  EXPECT_LT(seconds, 60);
  auto off = run_keel("validate --no-probe --rehearse --set stability.enabled=false");
  EXPECT_EQ(off.exit_code, 1) << off.output;
  EXPECT_NE(off.output.find("[WARN] rollback rehearsed:"), std::string::npos) << off.output;
  EXPECT_NE(off.output.find("did not go through pause -> rollback -> recovery"), std::string::npos)
      << off.output;
}

// The seed's §5.1 signals in the record: each metrics line holds the attention output's std per
// layer, and data statistics over the whole logging window (every applied step's samples), not
// over the logged step alone.
TEST(DefencesIntegration, MetricsHoldAttentionStatsAndWholeWindowDataStatistics) {
  ScratchDir d("window_statistics");
  auto r = run_keel("train --run-dir " + d.str() + kQuickRun +
                    " --set logging.every_steps=5 --set data.micro_batch_size=8"
                    " --set run.max_steps=20 --set checkpoint.every_steps=0"
                    " --set stability.screen.enabled=false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int64_t previous = 0;
  for (auto& m : read_jsonl(d.path() / "metrics.jsonl")) {
    const int64_t step = m["step"].get<int64_t>();
    ASSERT_TRUE(m.contains("attn_out_std")) << m.dump();
    for (const char* layer : {"layers.0", "layers.1"})
      EXPECT_GT(m["attn_out_std"][layer].get<double>(), 0.0) << layer << " " << m.dump();
    // Every applied step of the window (the screen is off here: no sample is masked).
    EXPECT_EQ(m["sample_loss"]["n"].get<int64_t>(), (step - previous) * 8)
        << "window ending at step " << step;
    previous = step;
  }
  EXPECT_EQ(previous, 20);
}

}  // namespace
}  // namespace keel::testing
