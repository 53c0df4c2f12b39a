#include "cli/config_args.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "common/error.h"

namespace keel::cli {

void add_config_options(CLI::App& sub, ConfigArgs& args) {
  sub.add_option("config", args.path, "YAML config (default: the embedded configs/tiny.yaml)");
  sub.add_option("--set", args.overrides, "override a key: --set optim.lr=3e-4 (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

config::LoadedConfig load(const ConfigArgs& args) {
  if (args.path.empty())
    return config::load_config_from_string(embedded_default_config(), kEmbeddedConfigName,
                                           args.overrides);
  return config::load_config(args.path, args.overrides);
}

int print_diagnostics(const std::vector<config::Diagnostic>& diagnostics) {
  int errors = 0;
  for (const auto& d : diagnostics) {
    std::cerr << d.format() << "\n";
    if (d.severity == config::Diagnostic::Severity::kError) ++errors;
  }
  return errors;
}

}  // namespace keel::cli
