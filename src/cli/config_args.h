// Loading + validating the config named on the command line, shared by validate and train.
#pragma once

#include "cli/commands.h"
#include "config/load.h"
#include "config/validate.h"

namespace keel::cli {

void add_config_options(CLI::App& sub, ConfigArgs& args);
config::LoadedConfig load(const ConfigArgs& args);
// Prints diagnostics to stderr; returns the number of errors among them.
int print_diagnostics(const std::vector<config::Diagnostic>& diagnostics);

}  // namespace keel::cli
