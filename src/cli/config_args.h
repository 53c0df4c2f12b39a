// Loading + validating the config named on the command line, shared by validate and train.
#pragma once

#include "cli/commands.h"
#include "config/load.h"
#include "config/validate.h"

namespace keel::cli {

void add_config_options(CLI::App& sub, ConfigArgs& args);
config::LoadedConfig load(const ConfigArgs& args);
// Loading diagnostics plus validate()'s, sorted. A key that failed to load keeps its default, so
// validate()'s findings about that key would be about a value the user never wrote: dropped.
// With shards, `options.data_vocab_size` is set from data.path's meta.json (read here, once per
// start) unless the caller set it.
std::vector<config::Diagnostic> check(const config::LoadedConfig& loaded,
                                      config::ValidateOptions& options);
// The valid config with its `auto` keys resolved (the vocabulary from `data_vocab_size`, the
// figure check() read): what `keel train` runs and writes to config.resolved.yaml.
config::Config resolved(const config::LoadedConfig& loaded, std::optional<int64_t> data_vocab_size);
// Prints diagnostics to stderr; returns the number of errors among them.
int print_diagnostics(const std::vector<config::Diagnostic>& diagnostics);

}  // namespace keel::cli
