#include <CLI/CLI.hpp>
#include <filesystem>

#include <fmt/format.h>

#include <iostream>
#include <optional>

#include "cli/checklist.h"
#include "cli/checkpoint_cost.h"
#include "cli/config_args.h"
#include "cli/number_options.h"
#include "cli/rehearse.h"
#include "cli/resume_plan.h"
#include "model/memory_plan.h"
#include "train/micro_graph.h"
#include "train/trainer.h"

namespace keel::cli {
namespace fs = std::filesystem;

namespace {

model::MemoryPlanOptions plan_options(const config::Config& cfg, int64_t world) {
  model::MemoryPlanOptions options;
  options.world_size = world;
  options.cuda = cfg.run.device != config::Device::kCpu;
  // As a single process on a GPU would run it (several ranks have a process group: no graph).
  options.cuda_graphs =
      options.cuda && cfg.run.cuda_graphs != config::CudaGraphs::kOff &&
      train::graph_obstacle(cfg, torch::Device(torch::kCUDA, 0), world > 1).empty();
  return options;
}

// Nothing keel can change fits at this world size: the fewest ranks (doubling) at which the config
// fits as it is or with its cheapest change, or that no number of ranks makes it fit.
std::string more_ranks_advice(const config::Config& cfg, const model::MemoryPlanOptions& options,
                              double device_memory) {
  constexpr int64_t kMostRanks = int64_t{1} << 16;
  for (int64_t w = std::max<int64_t>(options.world_size, 1) * 2; w <= kMostRanks; w *= 2) {
    model::MemoryPlanOptions more = options;
    more.world_size = w;
    if (model::plan_memory(cfg, more).total() <= device_memory)
      return fmt::format(
          "nothing keel can change fits at {} rank(s); at {} ranks it fits as it is "
          "(--world-size {})",
          options.world_size, w, w);
    if (auto fit = model::cheapest_fit(cfg, more, device_memory))
      return fmt::format(
          "nothing keel can change fits at {} rank(s); at {} ranks (--world-size "
          "{}) the cheapest change that fits: {}",
          options.world_size, w, w, *fit);
  }
  return fmt::format(
      "nothing fits at any number of ranks up to {}: a smaller model, or a smaller "
      "data.micro_batch_size or model.seq_len",
      kMostRanks);
}

// With a device budget `plan` does not fit: says so, with the cheapest change that fits.
bool refuse_memory(const config::Config& cfg, const config::LoadedConfig& loaded,
                   const model::MemoryPlanOptions& options, const model::MemoryPlan& plan,
                   double device_memory) {
  if (device_memory <= 0 || plan.total() <= device_memory) return false;
  const auto fit = model::cheapest_fit(cfg, options, device_memory);
  config::Diagnostic d{
      config::Diagnostic::Severity::kError, "model", loaded.where("model"),
      fmt::format("the memory plan needs {:.2f} GB per rank, more than --device-memory {:.2f} GB{}",
                  plan.total() / 1e9, device_memory / 1e9,
                  "\nHINT: " + (fit ? "the cheapest change that fits: " + *fit
                                    : more_ranks_advice(cfg, options, device_memory)))};
  std::cerr << format_memory_plan(plan, cfg);
  print_diagnostics({d});
  return true;
}

struct ValidateFlags {
  ConfigArgs args;
  bool print_config = false;
  int64_t world = 1;
  double step_time = 0.0;
  bool no_probe = false;
  bool no_disk_check = false;
  bool rehearse = false;
  double device_memory = 0.0;
};

// `keel validate`: its exit code.
int run_validate(const ValidateFlags& f) {
  auto loaded = load(f.args);
  // Validation runs even when loading found errors, so every independent problem is
  // reported in one pass.
  config::ValidateOptions options;
  options.world_size = f.world;
  options.check_filesystem = !f.no_disk_check;
  auto diagnostics = check(loaded, options);
  int errors = print_diagnostics(diagnostics);
  if (errors > 0) {
    std::cerr << (f.args.path.empty() ? kEmbeddedConfigName : f.args.path) << ": " << errors
              << (errors == 1 ? " error" : " errors") << "\n";
    return 2;
  }
  const config::Config cfg = resolved(loaded, options.data_vocab_size);
  const auto plan_opts = plan_options(cfg, f.world);
  const auto plan = model::plan_memory(cfg, plan_opts);
  if (refuse_memory(cfg, loaded, plan_opts, plan, f.device_memory)) return 2;  // before any output
  // With --print-config, stdout is the config alone (loadable by `keel train`); the estimates,
  // the checklist and the verdict go to stderr.
  std::ostream& report = f.print_config ? std::cerr : std::cout;
  // As written, `auto` keys included; config.resolved.yaml records what a run resolved them to.
  if (f.print_config) std::cout << config::to_yaml(loaded.config) << std::flush;
  CheckpointCostOptions cost_options;
  cost_options.world_size = f.world;
  cost_options.probe = !f.no_probe;
  if (f.step_time > 0) cost_options.step_seconds = f.step_time;
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
  report << format_memory_plan(plan, cfg);
  report << model::format_rollback_memory(
      plan, cfg,
      model::rollback_memory_limit(cfg, static_cast<int>(std::max<int64_t>(f.world, 1))));
  std::optional<Rehearsal> rehearsal;
  if (f.rehearse) rehearsal = rehearse(cfg);
  report << format_checklist(
      walk_checklist(cfg, config::parameter_count(cfg.model), rehearsal ? &*rehearsal : nullptr));
  // An existing run: what each --resume would do there.
  const fs::path run_dir = train::resolve_run_dir(loaded.config, {});
  report << describe_resume(config::checkpoint_dir(loaded.config, run_dir.string()), run_dir);
  const std::string name = f.args.path.empty() ? kEmbeddedConfigName : f.args.path;
  if (rehearsal && (!rehearsal->passed || !rehearsal->lr_quiet)) {
    std::cerr << name << ": valid, but the rehearsal failed ("
              << (!rehearsal->passed && !rehearsal->lr_quiet
                      ? "rollback rehearsed, lr against the model"
                  : !rehearsal->passed ? "rollback rehearsed"
                                       : "lr against the model")
              << ", above)\n";
    return 1;
  }
  report << name << ": valid\n";
  return 0;
}

}  // namespace

void register_validate(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<ValidateFlags>();
  auto* sub =
      app.add_subcommand("validate", "check a config before launch; exit 0 valid, 2 invalid");
  add_config_options(*sub, f->args);
  sub->add_flag("--print-config", f->print_config, "print the resolved config (YAML) when valid");
  sub->add_option("--world-size", f->world, "ranks the run will use (for the global batch)")
      ->check(whole_at_least(1, "ranks"));
  sub->add_option("--step-time", f->step_time,
                  "measured seconds per optimizer step (from a previous run), for the checkpoint "
                  "cost estimate")
      ->check(positive("seconds"));
  sub->add_option("--device-memory", f->device_memory,
                  "memory on each rank's device, in bytes or with a unit (80e9, 80GB, 74.5GiB): "
                  "refuse a config whose memory plan does not fit, naming the cheapest change "
                  "that does")
      ->transform(byte_size());
  sub->add_flag("--no-probe", f->no_probe,
                "skip the disk-write and matmul probes behind the checkpoint cost estimate");
  sub->add_flag("--no-disk-check", f->no_disk_check,
                "skip the checks of this machine's checkpoint directory (writable, free space): "
                "for a config planned here and run elsewhere");
  sub->add_flag("--rehearse", f->rehearse,
                "rehearse a rollback: a short run of this config's model and data on this "
                "machine with a bad batch and an lr spike injected; exit 1 unless it pauses, "
                "rolls back and recovers");
  sub->footer(
      "Where the config's run directory exists, it also says what each --resume would load there.\n"
      "\n"
      "Examples:\n"
      "  keel validate                                   # the embedded default "
      "(configs/tiny.yaml)\n"
      "  keel validate configs/production-124m.yaml --step-time 0.9    # the locked production "
      "config\n"
      "  keel validate configs/tiny.yaml --world-size 4                 # as 4 ranks would run it\n"
      "  keel validate configs/gpt2-124m.yaml --device-memory 80e9      # does it fit 80 GB?\n"
      "  keel validate configs/tiny.yaml --set optim.lr=1e-3 --print-config");
  sub->callback([f, &exit_code] { exit_code = run_validate(*f); });
}

}  // namespace keel::cli
