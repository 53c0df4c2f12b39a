// Runs the real keel binary and reads what it leaves in a run directory (a ScratchDir).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/file_io.h"
#include "scratch_dir.h"

namespace keel::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_keel(const std::string& args) {
  std::string cmd = std::string(KEEL_BINARY) + " " + args + " 2>&1";
  CommandResult result;
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return result;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

// Overrides that make the embedded tiny config a run of seconds: every step logged, no periodic
// eval, a short warmup, one thread, deterministic, a smaller model.
inline const std::string kQuickRun =
    " --set logging.progress=off --set logging.every_steps=1 --set eval.batches=1"
    " --set eval.every_steps=0 --set schedule.warmup_steps=2 --set run.threads=1"
    " --set run.deterministic=true --set model.d_model=64 --set model.seq_len=32";

inline std::string source_path(const std::string& relative) {
  return std::string(KEEL_SOURCE_DIR) + "/" + relative;
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

}  // namespace keel::testing
