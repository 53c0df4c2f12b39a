// keel inspect CHECKPOINT_DIR: what a checkpoint holds and whether it verifies.
// Accepts a step directory, or a checkpoints directory (then the checkpoint LATEST names, with the
// usual fallback to the newest one that verifies). Exit 0 when it verifies, 2 when not.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpointer.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/weight_parts.h"
#include "cli/commands.h"
#include "cli/resume_plan.h"
#include "common/error.h"
#include "common/paths.h"

namespace keel::cli {

namespace fs = std::filesystem;

namespace {

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.1f} {}", v, units[u]);
}

// The model section of the stored config, read directly (the config module's loader would also
// validate, and a checkpoint from an older keel may not pass today's rules).
std::string config_summary(const fs::path& file) {
  try {
    YAML::Node root = YAML::LoadFile(file.string());
    YAML::Node m = root["model"];
    if (!m) return "(no model section)";
    std::string out;
    for (const char* key : {"arch", "d_model", "n_layers", "n_heads", "vocab_size", "seq_len"})
      if (m[key])
        out += fmt::format("{}{}={}", out.empty() ? "" : " ", key, m[key].as<std::string>());
    if (root["run"] && root["run"]["name"])
      out += " run.name=" + root["run"]["name"].as<std::string>();
    return out;
  } catch (const YAML::Exception& e) {
    return std::string("(unreadable: ") + e.what() + ")";
  }
}

int inspect(fs::path arg) {
  std::error_code ec;
  if (!fs::is_directory(arg, ec))
    throw CheckpointError(arg.string() + ": no such directory" + relative_note(arg));
  fs::path run_dir;
  // A run directory: its checkpoints/, and what each resume would do there.
  if (!fs::exists(arg / "MANIFEST.json", ec) && fs::is_directory(arg / "checkpoints", ec)) {
    run_dir = arg;
    arg /= "checkpoints";
  }
  if (!fs::exists(arg / "MANIFEST.json", ec))
    std::cout << describe_resume(arg, run_dir.empty() ? arg.parent_path() : run_dir);
  fs::path dir = arg;
  if (!fs::exists(arg / "MANIFEST.json", ec)) {
    auto r = checkpoint::resolve_checkpoint(arg, checkpoint::Pointer::kLatest);
    if (!r) throw CheckpointError(arg.string() + ": no checkpoint here verifies (or none exists)");
    dir = *r;
  }
  checkpoint::Manifest m = checkpoint::read_manifest(dir);  // throws, naming the file
  std::cout << "checkpoint:  " << fs::absolute(dir).lexically_normal().string() << "\n"
            << "step:        " << m.step << "\n"
            << "stable:      " << (m.stable ? "yes" : "no") << "\n"
            << "keel:        " << m.keel_version << "\n"
            << "config hash: " << m.config_hash << "\n"
            << "created:     " << m.created << "\n"
            << "world size:  " << m.world_size << "\n"
            << "files:\n";
  uint64_t total = 0;
  for (const auto& [name, f] : m.files) {
    std::cout << fmt::format("  {:<32} {:>12}  xxh3 {}\n", name, human_bytes(f.size), f.xxh3);
    total += f.size;
  }
  std::cout << fmt::format("  {:<32} {:>12}\n", "total", human_bytes(total));
  try {
    std::vector<std::string> listed;
    for (const auto& [name, f] : m.files) listed.push_back(name);
    const auto files = checkpoint::model_files(listed);
    if (files.empty()) throw CheckpointError("MANIFEST.json lists no model.safetensors");
    // A ZeRO-3 checkpoint: each rank's pieces, and one shape per parameter.
    const bool parts = files.front() != "model.safetensors";
    int64_t params = 0, tensors = 0;
    for (const auto& file : files) {
      for (const auto& t : checkpoint::read_safetensors_header(dir / file).tensors) {
        if (checkpoint::is_shape_key(t.name)) {
          ++tensors;
          continue;
        }
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        tensors += !parts;
        params += n;
      }
    }
    std::cout << fmt::format("model:       {} tensors, {} parameters{}\n", tensors, params,
                             parts ? fmt::format(" (in {} parts)", files.size()) : "");
  } catch (const CheckpointError& e) {
    std::cout << "model:       unreadable: " << e.what() << "\n";
  }
  if (fs::exists(dir / "config.yaml", ec))
    std::cout << "config:      " << config_summary(dir / "config.yaml") << "\n";
  checkpoint::VerifyResult v = checkpoint::verify_checkpoint(dir);
  if (v.ok) {
    std::cout << "verify:      OK (every file's size and xxh3 match MANIFEST.json)\n";
    return kExitOk;
  }
  std::cout << "verify:      FAILED: " << v.problem << "\n";
  std::cerr << "error: " << v.problem << "\n";
  return kExitUserError;
}

}  // namespace

void register_inspect(CLI::App& app, int& exit_code) {
  auto dir = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("inspect", "what a checkpoint holds, and whether it verifies");
  sub->add_option("CHECKPOINT_DIR", *dir,
                  "a step_N directory, a checkpoints directory (LATEST), or a run directory (its "
                  "checkpoints, and what --resume latest|stable would load)")
      ->required();
  sub->footer(
      "Examples:\n"
      "  keel inspect runs/tiny/checkpoints/step_00000400   # what it holds, whether it verifies\n"
      "  keel inspect runs/tiny                             # what each --resume would load");
  sub->callback([dir, &exit_code] { exit_code = inspect(*dir); });
}

}  // namespace keel::cli
