// The pre-launch checks over a merged config (Marian-style: a separate pass, before anything
// allocates). `keel validate` prints these; `keel train` runs the same pass and refuses on errors.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "config/load.h"

namespace keel::config {

struct ValidateOptions {
  int64_t world_size = 1;                  // ranks that will share the global batch
  bool check_filesystem = true;            // checkpoint dir writable, free space estimate
  std::optional<int64_t> data_vocab_size;  // vocabulary of the prepared data, when known
  std::optional<int64_t> parameter_count;  // when known (else estimated from the model shape)
  std::string run_dir;                     // `keel train --run-dir`; empty = run.out_dir/run.name
};

// Every problem at once: range and enum rules, cross-key rules, production.validated combinations,
// filesystem checks, and warnings for legal-but-risky settings. Errors first, then warnings, each
// sorted by location (file lines in order, then --set flags in order). The loading diagnostics
// (loaded.diagnostics: unknown keys, type errors, refused overrides) are not repeated here; a key
// that failed to load keeps its default, so running both gives every independent problem.
std::vector<Diagnostic> validate(const LoadedConfig& loaded, const ValidateOptions& options = {});

// The order validate() uses: errors before warnings, then by location. For merging
// loaded.diagnostics with validate()'s result into one list.
void sort_diagnostics(std::vector<Diagnostic>& diagnostics);

// The size of a checkpoint for the config's model in bytes, written by `world_size` ranks: fp32
// weights, the optimizer's fp32 moments (every rank's copy; under ZeRO-1 one copy in parts) and
// small state. Parameters and FLOPs per token: config::parameter_count / flops_per_token.
int64_t estimate_checkpoint_bytes(const Config& config, int64_t world_size = 1);

// Where checkpoints go when checkpoint.dir is not set: RUN_DIR/checkpoints, with RUN_DIR the
// given run directory or else run.out_dir/run.name; and the directory that exists now under
// which it will be created (canonical when it can be resolved).
std::filesystem::path checkpoint_dir(const Config& config, const std::string& run_dir = "");
std::filesystem::path nearest_existing_dir(std::filesystem::path path);

}  // namespace keel::config
