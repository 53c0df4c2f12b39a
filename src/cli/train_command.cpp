#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>

#include "checkpoint/hf_format.h"
#include "cli/config_args.h"
#include "cli/number_options.h"
#include "common/error.h"
#include "common/log.h"
#include "distributed/communicator.h"
#include "distributed/process_group.h"
#include "train/trainer.h"

namespace keel::cli {
namespace {

// --init-from DIR with model.qk_norm auto: DIR's model_type decides (checkpoint::hf_qk_norm), so
// that a LlamaForCausalLM starts a model without q/k norms and a Qwen3ForCausalLM one with them.
// A config.json that cannot be read is left to check_hf_config, which names the problem.
void qk_norm_from_hf(const std::string& dir, config::ModelConfig& m) {
  if (dir.empty() || m.qk_norm != config::Switch::kAuto) return;
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  if (!in) return;
  const auto hf = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (const auto qk_norm = checkpoint::hf_qk_norm(hf)) {
    m.qk_norm = *qk_norm;
    log::info("model", "model.qk_norm: {} from {}'s model_type (--init-from)",
              config::name_of(*qk_norm), dir);
  }
}

}  // namespace

void register_train(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ConfigArgs>();
  auto options = std::make_shared<train::TrainOptions>();
  auto resume = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("train", "train a model");
  add_config_options(*sub, *args);
  sub->add_option("--run-dir", options->run_dir, "run directory (default: run.out_dir/run.name)");
  sub->add_option("--resume", *resume,
                  "latest | stable | a checkpoint directory; `latest` with no checkpoint yet "
                  "starts fresh, so a restart loop can always pass it; `stable` is a recovery "
                  "(stability.recovery.on_resume)");
  sub->add_option("--resume-data", options->resume_data,
                  "a resume that is a recovery: `skip` sets the data consumed since the snapshot "
                  "aside (quarantine.jsonl), `replay` trains on it again")
      ->transform(CLI::CheckedTransformer(std::map<std::string, train::ResumeData>{
          {"skip", train::ResumeData::kSkip}, {"replay", train::ResumeData::kReplay}}));
  sub->add_option("--init-from", options->init_from,
                  "start from the weights of a Hugging Face model directory (`keel export "
                  "--format hf` writes one; its config.json must match the model section, and "
                  "an auto model.qk_norm follows its model_type); a resume that finds a "
                  "checkpoint uses the checkpoint's weights instead");
  sub->add_option("--profile", options->profile_steps,
                  "record STEPS optimizer steps (after the first two) with LibTorch's profiler "
                  "into RUN_DIR/profile/rank<R>_steps_<A>-<B>.json, a Chrome trace with the "
                  "step's stages (keel/data, keel/forward, keel/backward, keel/guard, "
                  "keel/optimizer, ...) marked; open it in chrome://tracing or ui.perfetto.dev")
      ->check(whole_at_least(1, "steps"));
  sub->footer(
      "Examples:\n"
      "  keel train                                       # the embedded default, on the CPU\n"
      "  keel train configs/fortunes.yaml --run-dir runs/fortunes\n"
      "  keel train configs/tiny.yaml --set run.max_steps=1000 --set optim.lr=1e-3\n"
      "  keel train configs/tiny.yaml --run-dir runs/tiny --resume latest   # after a crash or "
      "preemption\n"
      "  keel train configs/tiny.yaml --run-dir runs/tiny --resume stable   # back to the stable "
      "snapshot\n"
      "  keel train configs/tiny.yaml --run-dir runs/prof --profile 5     # where a step's "
      "time goes");
  sub->callback([args, options, resume, &exit_code] {
    options->resume = train::ResumeRequest::parse(*resume);
    auto loaded = load(*args);
    // One process, or a rank of a job that torchrun, Slurm or `keel launch` started: the world
    // size is known before validation, which checks the global batch it makes (a locked config's
    // production.validated combinations included).
    const distributed::LaunchEnv env = distributed::launch_env();
    log::init(env.rank, env.world_size);
    qk_norm_from_hf(options->init_from, loaded.config.model);
    config::ValidateOptions validate_options;
    validate_options.run_dir = options->run_dir;  // the free-space check looks where checkpoints go
    validate_options.world_size = env.world_size;
    auto diagnostics = check(loaded, validate_options);
    int errors = print_diagnostics(diagnostics);
    if (errors > 0)
      throw ConfigError(
          std::to_string(errors) + " config error(s); run `keel validate" +
          (env.world_size > 1 ? " --world-size " + std::to_string(env.world_size) : std::string()) +
          "` for the list");

    const config::Config cfg = resolved(loaded, validate_options.data_vocab_size);
    if (!options->init_from.empty()) checkpoint::check_hf_config(options->init_from, cfg.model);
    options->local_rank = env.local_rank;
    options->local_world_size = env.local_world_size;
    const auto comm = distributed::make_process_group(
        env, cfg.distributed, train::select_device(cfg.run.device, env.local_rank));
    train::Trainer trainer(cfg, config::to_yaml(cfg), *options, *comm);
    trainer.run();
    exit_code = 0;
  });
}

}  // namespace keel::cli
