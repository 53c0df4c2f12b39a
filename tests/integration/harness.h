// Runs the real keel binary and reads what it leaves in a run directory (a ScratchDir).
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace keel::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// A shell command line, run to its end.
inline CommandResult run_shell(const std::string& command) {
  CommandResult result;
  std::FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

inline CommandResult run_keel(const std::string& args) {
  return run_shell(std::string(keel::testing::kKeelBinary) + " " + args);
}

// Starts keel in the background with its output in `log`, and waits until it trains (run_dir has
// a metrics line) and half a second more. Returns its pid (not a child of ours: poll it with
// kill(pid, 0)), or 0 when it could not be started.
inline int start_keel_training(const std::string& args, const std::filesystem::path& run_dir,
                               const std::filesystem::path& log) {
  const std::string cmd = std::string(keel::testing::kKeelBinary) + " " + args + " > " +
                          log.string() + " 2>&1 & echo $!";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  int pid = 0;
  if (std::fscanf(p, "%d", &pid) != 1) pid = 0;
  pclose(p);
  for (int i = 0; i < 600 && !std::filesystem::exists(run_dir / "metrics.jsonl"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  return pid;
}

inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

// A run's logged losses by step (metrics.jsonl; where a resumed run logs a step again, its newer
// line).
inline std::map<int64_t, double> losses_by_step(const std::filesystem::path& run_dir) {
  std::map<int64_t, double> out;
  for (auto& m : read_jsonl(run_dir / "metrics.jsonl"))
    out[m["step"].get<int64_t>()] = m["loss"].get<double>();
  return out;
}

// Overrides that make the embedded tiny config a run of seconds: every step logged, no periodic
// eval, a short warmup, one thread, deterministic, a smaller model. And no q/k norms, the default
// before issue 47: the faults' expected outcomes and tests/golden/records were measured without
// them. A test of the default model sets model.qk_norm=auto after kQuickRun.
inline const std::string kQuickRun =
    " --set logging.progress=off --set logging.every_steps=1 --set eval.batches=1"
    " --set eval.every_steps=0 --set schedule.warmup_steps=2 --set run.threads=1"
    " --set run.deterministic=true --set model.d_model=64 --set model.seq_len=32"
    " --set model.qk_norm=off";

// Ten incidents of every kind over a 300-step run (--set faults=...): the defences test and the
// golden record run it.
inline const std::string kTenIncidentFaults =
    " --set 'faults=[{kind: corrupt_batch, mode: random_tokens, at_step: 40, steps: 5},"
    " {kind: lr_spike, factor: 100, at_step: 65, steps: 2},"
    " {kind: corrupt_batch, mode: repeat_token, at_step: 90, steps: 12},"
    " {kind: nan_grad, at_step: 115},"
    " {kind: corrupt_batch, mode: shuffled, at_step: 135, steps: 15},"
    " {kind: corrupt_batch, mode: random_tokens, at_step: 165, steps: 1},"
    " {kind: lr_spike, factor: 100, at_step: 190, steps: 2},"
    " {kind: corrupt_batch, mode: shuffled, at_step: 215, steps: 8},"
    " {kind: corrupt_batch, mode: random_tokens, at_step: 240, steps: 20},"
    " {kind: corrupt_batch, mode: repeat_token, at_step: 275, steps: 4}]'";

inline std::string source_path(const std::string& relative) {
  return std::string(keel::testing::kSourceDir) + "/" + relative;
}

// A program of the Python environment scripts/setup.sh made ($KEEL_CACHE or ~/.cache/keel, in
// torch-<version>/bin: python, torchrun), or empty when there is none.
inline std::string setup_env_program(const std::string& name) {
  for (const char* base : {std::getenv("KEEL_CACHE"), std::getenv("HOME")}) {
    if (!base) continue;
    for (const char* dir : {"/torch-2.11.0/bin/", "/.cache/keel/torch-2.11.0/bin/"})
      if (std::filesystem::exists(std::string(base) + dir + name))
        return std::string(base) + dir + name;
  }
  return "";
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Trains the embedded config for 60 steps (T=64) on the prepared dataset `data` into `run_dir`,
// with a 3-step region of random tokens at step 40, and returns quarantine.jsonl's records: the
// samples that region set aside. Empty, with a failure recorded, when the run does not end well.
inline std::vector<nlohmann::json> quarantine_of_a_bad_region(
    const std::string& data, const std::filesystem::path& run_dir) {
  const auto r = run_keel("train --run-dir " + run_dir.string() +
                          " --set data.source=shards --set data.path=" + data +
                          " --set model.vocab_size=auto --set model.seq_len=64"
                          " --set run.max_steps=60 --set logging.progress=off"
                          " --set 'faults=[{kind: corrupt_batch, mode: random_tokens, "
                          "at_step: 40, steps: 3}]'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? read_jsonl(run_dir / "quarantine.jsonl")
                          : std::vector<nlohmann::json>{};
}

// A fortune file (quotations separated by "%" lines) as JSONL records {id: "fortune-K", text}, one
// per line, so record K is on line K + 1; returns how many.
inline int64_t write_fortunes_jsonl(const std::string& fortunes, const std::filesystem::path& out) {
  std::ifstream in(fortunes);
  std::ofstream jsonl(out);
  std::string line, doc;
  int64_t records = 0;
  while (std::getline(in, line)) {
    if (line != "%") {
      doc += line + "\n";
      continue;
    }
    if (!doc.empty())
      jsonl << nlohmann::json{{"id", "fortune-" + std::to_string(records++)}, {"text", doc}}.dump()
            << "\n";
    doc.clear();
  }
  return records;
}

// Two prepared datasets are the same: every file but the reports byte for byte, and meta.json but
// for the command line (and a merge's record of its parts). Returns how many files it compared.
inline size_t expect_same_dataset(const std::filesystem::path& a, const std::filesystem::path& b) {
  auto bytes = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  size_t compared = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(a)) {
    if (!entry.is_regular_file()) continue;
    const auto name = entry.path().filename().string();
    if (name == "meta.json" || name == "report.json" || name == "report.txt") continue;
    const auto other = b / std::filesystem::relative(entry.path(), a);
    EXPECT_TRUE(std::filesystem::exists(other)) << other;
    EXPECT_TRUE(bytes(entry.path()) == bytes(other)) << other << " differs from " << entry.path();
    ++compared;
  }
  auto meta = [&](const std::filesystem::path& dir) {
    auto m = nlohmann::json::parse(bytes(dir / "meta.json"));
    m.erase("prepare_command");
    m.erase("merged_parts");
    return m;
  };
  EXPECT_EQ(meta(a), meta(b));
  return compared;
}

}  // namespace keel::testing
