// The run record as a baseline (issue 26, as torchtitan's loss-curve baseline): a fixed-seed
// deterministic run of the tiny model, and one with the ten-incident fault list, must write the
// metrics.jsonl, events.jsonl, eval.jsonl and quarantine.jsonl in tests/golden/records/, timings
// aside. A redesign of the trainer that changes what a run computes or decides fails here.
//
// The files were written by this test with KEEL_UPDATE_GOLDEN=1 (scripts/test.sh -R GoldenRecord
// after `export KEEL_UPDATE_GOLDEN=1`); rewrite them only for a change meant to alter a run, and
// say so in the commit. Floats compare within a relative 1e-4 (another CPU's kernels may sum in
// another order); everything else (steps, counts, event kinds, decisions, sample ids) exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <set>

#include "harness.h"

namespace keel::testing {
namespace {
namespace fs = std::filesystem;

const fs::path kGoldenDir = fs::path(keel::testing::kSourceDir) / "tests/golden/records";
const std::vector<std::string> kFiles = {"metrics.jsonl", "events.jsonl", "eval.jsonl",
                                         "quarantine.jsonl"};

// Keys whose values are measured times or memory, or follow from them.
bool is_timing(const std::string& key) {
  static const std::set<std::string> kTimings = {
      "tokens_per_s", "step_ms",    "loader_wait_ms", "guard_ms", "comm_ms",      "queue_depth",
      "stall_s",      "seconds",    "wait_ms",        "waits",    "save_stall_s", "step_s",
      "overhead",     "peak_bytes", "peak_over_plan", "replay_s", "restore_s"};
  return kTimings.count(key) > 0;
}

// Paths name the scratch directory and abandoned timelines carry the time they were made.
nlohmann::json normalized(const nlohmann::json& j, const std::string& run_dir) {
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto& [k, v] : j.items())
      if (!is_timing(k)) out[k] = normalized(v, run_dir);
    return out;
  }
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (auto& v : j) out.push_back(normalized(v, run_dir));
    return out;
  }
  if (j.is_string()) {
    std::string s = j.get<std::string>();
    for (size_t at; (at = s.find(run_dir)) != std::string::npos;)
      s.replace(at, run_dir.size(), "RUN");
    static const std::regex kTime(R"(\d{4}-\d\d-\d\dT\d\d[-:]\d\d[-:]\d\d(\.\d+)?Z?)");
    return std::regex_replace(s, kTime, "TIME");
  }
  return j;
}

std::vector<nlohmann::json> record(const fs::path& run_dir, const std::string& file) {
  std::vector<nlohmann::json> out;
  if (!fs::exists(run_dir / file)) return out;
  for (auto& r : read_jsonl(run_dir / file)) {
    if (file == "events.jsonl" && r.value("kind", "") == "loader_wait") continue;  // timing
    out.push_back(normalized(r, run_dir.string()));
  }
  return out;
}

// Equal, numbers within a relative `tolerance`; `where` says where the first difference is.
bool same(const nlohmann::json& a, const nlohmann::json& b, double tolerance, std::string& where) {
  if (a.is_number_float() || b.is_number_float()) {
    if (!a.is_number() || !b.is_number()) return false;
    const double x = a.get<double>(), y = b.get<double>();
    if (std::isnan(x) && std::isnan(y)) return true;
    if (std::abs(x - y) <= tolerance * std::max({std::abs(x), std::abs(y), 1e-12})) return true;
    where = a.dump() + " vs " + b.dump();
    return false;
  }
  if (a.type() != b.type() || a.size() != b.size()) {
    where = a.dump().substr(0, 300) + " vs " + b.dump().substr(0, 300);
    return false;
  }
  if (a.is_object()) {
    for (auto& [k, v] : a.items()) {
      if (!b.contains(k)) {
        where = "key " + k + " missing";
        return false;
      }
      if (!same(v, b.at(k), tolerance, where)) {
        where = k + ": " + where;
        return false;
      }
    }
    return true;
  }
  if (a.is_array()) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!same(a[i], b[i], tolerance, where)) {
        where = "[" + std::to_string(i) + "] " + where;
        return false;
      }
    return true;
  }
  if (a != b) where = a.dump() + " vs " + b.dump();
  return a == b;
}

void check_against_golden(const std::string& name, const std::string& args) {
  ScratchDir d("golden_" + name);
  auto r = run_keel("train " + source_path("configs/tiny.yaml") + args + " --run-dir " + d.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path golden = kGoldenDir / name;
  const bool update = std::getenv("KEEL_UPDATE_GOLDEN") != nullptr;
  for (const auto& file : kFiles) {
    SCOPED_TRACE(file);
    const auto now = record(d.path(), file);
    if (update) {
      fs::create_directories(golden);
      std::ofstream out(golden / file);
      for (const auto& j : now) out << j.dump() << "\n";
      continue;
    }
    ASSERT_TRUE(fs::exists(golden / file)) << (golden / file) << " is missing";
    const auto want = read_jsonl(golden / file);
    ASSERT_EQ(now.size(), want.size()) << "records in " << file;
    for (size_t i = 0; i < now.size(); ++i) {
      std::string where;
      ASSERT_TRUE(same(want[i], now[i], 1e-4, where))
          << file << " line " << i + 1 << ": " << where << "\n golden: " << want[i].dump()
          << "\n now:    " << now[i].dump();
    }
  }
  if (update) GTEST_SKIP() << "golden records rewritten in " << golden;
}

// A fixed checkpoint cadence: the auto one follows measured save and step times.
const std::string kDeterministic = kQuickRun +
                                   " --set checkpoint.every_steps=10 --set eval.every_steps=20"
                                   " --set logging.sample_ids=false";

TEST(GoldenRecord, TinyRunWritesTheGoldenRecord) {
  check_against_golden("tiny", kDeterministic + " --set run.max_steps=60");
}

TEST(GoldenRecord, TenIncidentRunWritesTheGoldenRecord) {
  check_against_golden("ten_incidents",
                       kDeterministic + " --set run.max_steps=300 --set schedule.warmup_steps=20" +
                           kTenIncidentFaults);
}

}  // namespace
}  // namespace keel::testing
