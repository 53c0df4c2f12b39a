#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/config_args.h"

namespace keel::cli {

void register_validate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ConfigArgs>();
  auto print_config = std::make_shared<bool>(false);
  auto world = std::make_shared<int64_t>(1);
  auto* sub = app.add_subcommand("validate", "check a config before launch; exit 0 valid, 2 invalid");
  add_config_options(*sub, *args);
  sub->add_flag("--print-config", *print_config, "print the resolved config (YAML) when valid");
  sub->add_option("--world-size", *world, "ranks the run will use (for the global batch)")
      ->check(CLI::PositiveNumber);
  sub->callback([args, print_config, world, &exit_code] {
    auto loaded = load(*args);
    // Validation runs even when loading found errors, so every independent problem is
    // reported in one pass.
    config::ValidateOptions options;
    options.world_size = *world;
    auto diagnostics = check(loaded, options);
    int errors = print_diagnostics(diagnostics);
    if (errors > 0) {
      std::cerr << (args->path.empty() ? kEmbeddedConfigName : args->path) << ": " << errors
                << (errors == 1 ? " error" : " errors") << "\n";
      exit_code = 2;
      return;
    }
    if (*print_config) std::cout << config::to_yaml(loaded.config);
    std::cout << (args->path.empty() ? kEmbeddedConfigName : args->path) << ": valid\n";
    exit_code = 0;
  });
}

}  // namespace keel::cli
