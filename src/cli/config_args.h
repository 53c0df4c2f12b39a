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
std::vector<config::Diagnostic> check(const config::LoadedConfig& loaded,
                                      const config::ValidateOptions& options);
// The valid config with its `auto` keys resolved (the data's vocabulary read from data.path's
// meta.json when the source is shards): what `keel train` runs and writes to
// config.resolved.yaml.
config::Config resolved(const config::LoadedConfig& loaded);
// Prints diagnostics to stderr; returns the number of errors among them.
int print_diagnostics(const std::vector<config::Diagnostic>& diagnostics);

}  // namespace keel::cli
