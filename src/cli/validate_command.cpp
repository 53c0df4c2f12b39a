#include <CLI/CLI.hpp>
#include <filesystem>

#include <fmt/format.h>

#include <iostream>

#include "cli/checklist.h"
#include "cli/checkpoint_cost.h"
#include "cli/config_args.h"
#include "cli/resume_plan.h"
#include "train/trainer.h"

namespace keel::cli {
namespace fs = std::filesystem;

void register_validate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ConfigArgs>();
  auto print_config = std::make_shared<bool>(false);
  auto world = std::make_shared<int64_t>(1);
  auto step_time = std::make_shared<double>(0.0);
  auto no_probe = std::make_shared<bool>(false);
  auto* sub =
      app.add_subcommand("validate", "check a config before launch; exit 0 valid, 2 invalid");
  add_config_options(*sub, *args);
  sub->add_flag("--print-config", *print_config, "print the resolved config (YAML) when valid");
  sub->add_option("--world-size", *world, "ranks the run will use (for the global batch)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--step-time", *step_time,
                  "measured seconds per optimizer step (from a previous run), for the checkpoint "
                  "cost estimate")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--no-probe", *no_probe,
                "skip the disk-write and matmul probes behind the checkpoint cost estimate");
  sub->footer(
      "Where the config's run directory exists, it also says what each --resume would load there.\n"
      "\n"
      "Examples:\n"
      "  keel validate                                   # the embedded default "
      "(configs/tiny.yaml)\n"
      "  keel validate configs/production-124m.yaml --step-time 0.9    # the locked production "
      "config\n"
      "  keel validate configs/tiny.yaml --world-size 4                 # as 4 ranks would run it\n"
      "  keel validate configs/tiny.yaml --set optim.lr=1e-3 --print-config");
  sub->callback([args, print_config, world, step_time, no_probe, &exit_code] {
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
    const config::Config cfg = resolved(loaded);
    // With --print-config, stdout is the config alone (loadable by `keel train`); the estimates,
    // the checklist and the verdict go to stderr.
    std::ostream& report = *print_config ? std::cerr : std::cout;
    // As written, `auto` keys included; config.resolved.yaml records what a run resolved them to.
    if (*print_config) std::cout << config::to_yaml(loaded.config) << std::flush;
    CheckpointCostOptions cost_options;
    cost_options.world_size = *world;
    cost_options.probe = !*no_probe;
    if (*step_time > 0) cost_options.step_seconds = *step_time;
    const auto cost = estimate_checkpoint_cost(cfg, cost_options);
    report << format_checkpoint_cost(cost, cfg);
    if (cost.share && *cost.share > kCheckpointShareWarn) {
      config::Diagnostic d{
          config::Diagnostic::Severity::kWarning, "checkpoint.every_steps",
          loaded.where("checkpoint.every_steps"),
          fmt::format("saving costs about {:.1f}% of training time; raise "
                      "checkpoint.every_steps{}",
                      *cost.share * 100,
                      loaded.config.checkpoint.async ? "" : " or set checkpoint.async: true")};
      print_diagnostics({d});
    }
    report << format_checklist(walk_checklist(cfg, config::parameter_count(cfg.model)));
    // An existing run: what each --resume would do there.
    const fs::path run_dir = train::resolve_run_dir(loaded.config, {});
    report << describe_resume(config::checkpoint_dir(loaded.config, run_dir.string()), run_dir);
    report << (args->path.empty() ? kEmbeddedConfigName : args->path) << ": valid\n";
    exit_code = 0;
  });
}

}  // namespace keel::cli
