// Tests of config/validate: every rule reports at the key's line, all problems come at once,
// errors sorted by location before warnings, production.validated, vocab and filesystem checks,
// and the parameter estimate against real model sizes.
#include "config/validate.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "scratch_dir.h"

namespace keel::config {
namespace {

using keel::testing::ScratchDir;

ValidateOptions without_filesystem() {
  ValidateOptions options;
  options.check_filesystem = false;
  return options;
}

// Loading's diagnostics (choice-valued keys are enums, checked as they are read) and validate()'s.
std::vector<Diagnostic> check(const std::string& yaml,
                              const std::vector<std::string>& overrides = {},
                              const ValidateOptions& options = without_filesystem()) {
  const LoadedConfig loaded = load_config_from_string(yaml, "v.yaml", overrides);
  std::vector<Diagnostic> out = loaded.diagnostics;
  for (auto& d : validate(loaded, options)) out.push_back(std::move(d));
  return out;
}

std::vector<Diagnostic> of_severity(const std::vector<Diagnostic>& all,
                                    Diagnostic::Severity severity) {
  std::vector<Diagnostic> out;
  for (const auto& d : all) {
    if (d.severity == severity) out.push_back(d);
  }
  return out;
}
std::vector<Diagnostic> errors(const std::vector<Diagnostic>& all) {
  return of_severity(all, Diagnostic::Severity::kError);
}
std::vector<Diagnostic> warnings(const std::vector<Diagnostic>& all) {
  return of_severity(all, Diagnostic::Severity::kWarning);
}

std::string dump(const std::vector<Diagnostic>& all) {
  std::string out;
  for (const auto& d : all) out += "\n  " + d.format();
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool has_warning(const std::vector<Diagnostic>& all, const std::string& key) {
  for (const auto& d : warnings(all)) {
    if (d.key == key) return true;
  }
  return false;
}

TEST(ConfigValidate, DefaultsHaveNoErrors) {
  const auto all = check("");
  EXPECT_TRUE(errors(all).empty()) << dump(all);
}

struct RuleCase {
  std::string yaml;
  std::string key;
  int line;
  std::string message_part;
};

TEST(ConfigValidate, EachRuleReportsOneErrorAtItsKey) {
  const std::vector<RuleCase> cases = {
      {"run:\n  max_steps: 0\n", "run.max_steps", 2, "must be >= 1 (got 0)"},
      {"run:\n  device: gpu\n", "run.device", 2, "must be one of auto|cpu|cuda (got 'gpu')"},
      {"run:\n  precision: fp8\n", "run.precision", 2, "fp32|bf16|fp16"},
      {"run:\n  fp16_initial_scale: 0\n", "run.fp16_initial_scale", 2, "must be > 0"},
      {"model:\n  vocab_size: auto\n", "model.vocab_size", 2, "data.source: shards"},
      {"logging:\n  every_steps: 10\n  tensorboard_every_steps: 15\n",
       "logging.tensorboard_every_steps", 3, "use 10 or 20"},
      {"stability:\n  screen:\n    factor: 1\n", "stability.screen.factor", 3, "(1, inf)"},
      {"stability:\n  rollback:\n    max_incidents: 0\n", "stability.rollback.max_incidents", 3,
       ">= 1"},
      {"checkpoint:\n  max_overhead: 0\n", "checkpoint.max_overhead", 2, "(0, 1)"},
      {"schedule:\n  kind: three_phase\n  warmup_steps: 900\n", "schedule.warmup_steps", 3,
       "must fit in run.max_steps"},
      {"faults:\n  - kind: splice_data\n", "faults[0].path", 2, "keel prepare"},
      {"faults:\n  - kind: crash\n    path: x\n", "faults[0].path", 3, "only splice_data"},
      {"model:\n  arch: bert\n", "model.arch", 2, "llama|gpt2"},
      {"model:\n  vocab_size: 1\n", "model.vocab_size", 2, ">= 2"},
      {"model:\n  seq_len: 0\n", "model.seq_len", 2, ">= 1"},
      {"model:\n  dropout: 1.0\n", "model.dropout", 2, "must be in [0, 1)"},
      {"model:\n  n_heads: 3\n", "model.n_heads", 2, "must divide model.d_model (128)"},
      {"model:\n  n_kv_heads: 3\n", "model.n_kv_heads", 2, "must divide model.n_heads (4)"},
      {"model:\n  d_model: 132\n", "model.d_model", 2, "even head dim"},
      {"data:\n  source: shards\n", "data.source", 2, "data.path"},
      {"data:\n  source: files\n", "data.source", 2, "synthetic|shards"},
      {"data:\n  micro_batch_size: 0\n", "data.micro_batch_size", 2, ">= 1"},
      {"data:\n  grad_accum_steps: 0\n", "data.grad_accum_steps", 2, ">= 1"},
      {"data:\n  sampling: shuffle\n", "data.sampling", 2, "stratified|random|sequential"},
      {"data:\n  loader:\n    low_watermark: 8\n", "data.loader.low_watermark", 3,
       "below data.loader.high_watermark"},
      {"data:\n  loader:\n    high_watermark: 20\n", "data.loader.high_watermark", 3,
       "<= data.loader.queue_capacity"},
      {"data:\n  consumed_tolerance: 0\n", "data.consumed_tolerance", 2, "must be in (0, 1)"},
      {"optim:\n  name: sgd\n", "optim.name", 2, "adamw|lion"},
      {"optim:\n  lr: 0\n", "optim.lr", 2, "must be in (0, 1]"},
      {"optim:\n  lr: 2\n", "optim.lr", 2, "must be in (0, 1]"},
      {"optim:\n  betas: [0.9]\n", "optim.betas", 2, "exactly 2 values"},
      {"optim:\n  betas: [0.9, 1.0]\n", "optim.betas", 2, "must be in (0, 1)"},
      {"optim:\n  eps: 0\n", "optim.eps", 2, "must be > 0"},
      {"optim:\n  weight_decay: 0.5\n", "optim.weight_decay", 2, "must be in [0, 0.1]"},
      {"optim:\n  grad_clip: -1\n", "optim.grad_clip", 2, "must be > 0"},
      {"optim:\n  clip_mode: x\n", "optim.clip_mode", 2, "global|adaptive"},
      {"optim:\n  fused: maybe\n", "optim.fused", 2, "auto|on|off"},
      {"schedule:\n  kind: linear\n", "schedule.kind", 2, "cosine|three_phase|constant"},
      {"schedule:\n  warmup_steps: -1\n", "schedule.warmup_steps", 2, ">= 0"},
      {"schedule:\n  warmup_steps: 1000\n", "schedule.warmup_steps", 2,
       "below run.max_steps (1000)"},
      {"schedule:\n  min_lr_ratio: 1.5\n", "schedule.min_lr_ratio", 2, "must be in [0, 1]"},
      {"schedule:\n  phases:\n    warmup: 0.3\n", "schedule.phases", 2, "must sum to 1"},
      {"schedule:\n  phases:\n    decay: -0.2\n    stable: 1.0\n", "schedule.phases.decay", 3,
       "[0, 1]"},
      {"stability:\n  median_window: 0\n", "stability.median_window", 2, ">= 1"},
      {"stability:\n  warn_factor: 1\n", "stability.warn_factor", 2, "must be in (1, inf)"},
      {"stability:\n  pause_factor: 4\n", "stability.pause_factor", 2,
       "above stability.warn_factor (5)"},
      {"stability:\n  nan_policy: ignore\n", "stability.nan_policy", 2, "skip|pause|abort"},
      {"stability:\n  recovery:\n    lr_factor: 0\n", "stability.recovery.lr_factor", 3, "(0, 1]"},
      {"stability:\n  recovery:\n    steps: -1\n", "stability.recovery.steps", 3, ">= 0"},
      {"checkpoint:\n  keep_last: 0\n", "checkpoint.keep_last", 2, ">= 1"},
      {"checkpoint:\n  every_steps: -5\n", "checkpoint.every_steps", 2, ">= 0"},
      {"eval:\n  every_steps: -1\n", "eval.every_steps", 2, ">= 0"},
      {"logging:\n  progress: sometimes\n", "logging.progress", 2, "auto|on|off"},
      {"distributed:\n  backend: mpi\n", "distributed.backend", 2, "auto|nccl|gloo"},
      {"distributed:\n  zero: 4\n", "distributed.zero", 2, "ZeRO-3"},
      {"distributed:\n  reduce_dtype: bf16\n", "distributed.reduce_dtype", 2, "zero: 3"},
      {"faults:\n  - kind: meteor\n", "faults[0].kind", 2, "corrupt_batch|nan_grad|lr_spike"},
      {"faults:\n  - kind: corrupt_batch\n    mode: reverse\n", "faults[0].mode", 3,
       "random_tokens|repeat_token|shuffled"},
  };
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.yaml);
    const auto found = errors(check(tc.yaml));
    ASSERT_EQ(found.size(), 1u) << dump(found);
    EXPECT_EQ(found[0].key, tc.key);
    EXPECT_EQ(found[0].loc.file, "v.yaml");
    EXPECT_EQ(found[0].loc.line, tc.line);
    EXPECT_TRUE(contains(found[0].message, tc.message_part)) << found[0].message;
  }
}

TEST(ConfigValidate, ReportsEveryErrorSortedByLineThenWarnings) {
  // Planted out of check order (model is checked before optim and schedule) to test the sorting.
  const std::string yaml =
      "run:\n"
      "  precision: fp16\n"  // line 2: warning only
      "  max_steps: 500\n"
      "optim:\n"
      "  lr: -1\n"  // line 5: error
      "schedule:\n"
      "  warmup_steps: 600\n"  // line 7: error, not below max_steps
      "model:\n"
      "  dropout: 1.5\n";  // line 9: error
  const auto all = check(yaml);
  const auto found = errors(all);
  ASSERT_EQ(found.size(), 3u) << dump(all);
  EXPECT_EQ(found[0].loc.line, 5);
  EXPECT_EQ(found[0].key, "optim.lr");
  EXPECT_EQ(found[1].loc.line, 7);
  EXPECT_EQ(found[1].key, "schedule.warmup_steps");
  EXPECT_EQ(found[2].loc.line, 9);
  EXPECT_EQ(found[2].key, "model.dropout");
  ASSERT_FALSE(warnings(all).empty());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].severity,
              i < 3 ? Diagnostic::Severity::kError : Diagnostic::Severity::kWarning)
        << dump(all);
  }
  EXPECT_EQ(found[0].format(), "v.yaml:5:7: error: optim.lr: must be in (0, 1] (got -1)");
}

TEST(ConfigValidate, DoesNotRepeatTheLoadingDiagnostics) {
  const LoadedConfig loaded =
      load_config_from_string("optim:\n  lrr: 0.1\n", "v.yaml", {"run.seed=x"});
  EXPECT_EQ(loaded.diagnostics.size(), 2u);
  EXPECT_TRUE(errors(validate(loaded, without_filesystem())).empty());
}

TEST(ConfigValidate, SortDiagnosticsPutsErrorsFirstThenFileLinesThenFlags) {
  using S = Diagnostic::Severity;
  std::vector<Diagnostic> all = {{S::kWarning, "a", {"v.yaml", 1, 1}, ""},
                                 {S::kError, "b", {"--set", 0, 1}, ""},
                                 {S::kError, "c", {"v.yaml", 9, 1}, ""},
                                 {S::kError, "d", {"v.yaml", 2, 5}, ""},
                                 {S::kError, "e", {"v.yaml", 2, 3}, ""}};
  sort_diagnostics(all);
  std::string order;
  for (const auto& d : all) order += d.key;
  EXPECT_EQ(order, "edcba");
}

TEST(ConfigValidate, AnOverriddenValueIsReportedAtItsFlag) {
  const auto found = errors(check("optim:\n  lr: 0.001\n", {"run.seed=1", "optim.lr=5"}));
  ASSERT_EQ(found.size(), 1u) << dump(found);
  EXPECT_EQ(found[0].format(), "--set[2]: error: optim.lr: must be in (0, 1] (got 5)");
}

TEST(ConfigValidate, WarningsDoNotCountAsErrors) {
  const LoadedConfig loaded = load_config_from_string("run:\n  precision: fp16\n", "v.yaml");
  const auto all = validate(loaded, without_filesystem());
  EXPECT_TRUE(has_warning(all, "run.precision")) << dump(all);
  EXPECT_TRUE(errors(all).empty()) << dump(all);
  EXPECT_FALSE(loaded.has_errors());
}

TEST(ConfigValidate, WarnsAboutLegalButRiskySettings) {
  const auto slow_beta = check("run:\n  max_steps: 20000\noptim:\n  betas: [0.9, 0.999]\n");
  ASSERT_TRUE(has_warning(slow_beta, "optim.betas")) << dump(slow_beta);
  EXPECT_FALSE(has_warning(check("optim:\n  betas: [0.9, 0.999]\n"), "optim.betas"));  // short run
  for (const auto& d : warnings(slow_beta)) {
    if (d.key == "optim.betas") {
      EXPECT_TRUE(contains(d.message, "β2=0.999 reacts slowly")) << d.message;
    }
  }

  // Weight decay 0.1 (GPT-3's and Llama's, as the shipped configs use it) is no risk.
  EXPECT_FALSE(has_warning(check("optim:\n  weight_decay: 0.1\n"), "optim.weight_decay"));
  EXPECT_FALSE(has_warning(check("optim:\n  weight_decay: 0.01\n"), "optim.weight_decay"));

  const std::string seven_b =
      "model:\n  vocab_size: 32000\n  d_model: 4096\n  n_layers: 32\n  n_heads: 32\n"
      "schedule:\n  warmup_steps: 100\n";
  const auto big = check(seven_b);
  EXPECT_TRUE(has_warning(big, "schedule.warmup_steps")) << dump(big);
  EXPECT_TRUE(errors(big).empty()) << dump(big);
  EXPECT_FALSE(has_warning(check(seven_b, {"schedule.warmup_steps=2000", "run.max_steps=10000"}),
                           "schedule.warmup_steps"));
  ValidateOptions known_size = without_filesystem();
  known_size.parameter_count = 2'000'000'000;
  EXPECT_TRUE(has_warning(check("", {}, known_size), "schedule.warmup_steps"));
  EXPECT_FALSE(has_warning(check(""), "schedule.warmup_steps"));
}

const char* kCombos =
    "production:\n"
    "  validated:\n"
    "    - {lr: [1e-4, 5e-4], global_batch: [8, 32]}\n"
    "    - {lr: [1e-3, 2e-3], global_batch: [64, 128]}\n";

TEST(ConfigValidate, ValidatedCombinationsAcceptPointsInsideOne) {
  EXPECT_TRUE(errors(check(kCombos)).empty());  // lr 3e-4, global batch 8 x 1 x 1
  ValidateOptions eight_ranks = without_filesystem();
  eight_ranks.world_size = 8;
  EXPECT_TRUE(errors(check(kCombos, {"optim.lr=1.5e-3"}, eight_ranks)).empty());
  EXPECT_TRUE(errors(check(kCombos, {"data.grad_accum_steps=4"})).empty());  // 32, on the edge
}

TEST(ConfigValidate, ValidatedCombinationsRejectPointsOutsideAll) {
  ValidateOptions eight_ranks = without_filesystem();
  eight_ranks.world_size = 8;
  const auto found = errors(check(kCombos, {}, eight_ranks));  // lr 3e-4 but global batch 64
  ASSERT_EQ(found.size(), 1u) << dump(found);
  EXPECT_EQ(found[0].key, "production.validated");
  EXPECT_EQ(found[0].loc.line, 2);
  EXPECT_TRUE(contains(found[0].message, "global_batch=64")) << found[0].message;
  EXPECT_TRUE(contains(found[0].message, "world_size 8")) << found[0].message;
  EXPECT_TRUE(contains(found[0].message, "global_batch [64, 128]")) << found[0].message;
  EXPECT_EQ(errors(check(kCombos, {"optim.lr=7e-4"})).size(), 1u);
  // A global batch beyond every combination (32 ranks: 256): the seed's §4.2 advice, lr scaled by
  // the square root of the batch ratio from the nearest combination, with a longer warmup.
  ValidateOptions many_ranks = without_filesystem();
  many_ranks.world_size = 32;
  const auto beyond = errors(check(kCombos, {}, many_ranks));
  ASSERT_EQ(beyond.size(), 1u) << dump(beyond);
  EXPECT_TRUE(contains(beyond[0].message, "sqrt(256/128) gives lr 0.00283")) << beyond[0].message;
  EXPECT_TRUE(contains(beyond[0].message, "longer warmup")) << beyond[0].message;
}

// Since issue 50 an async save's barriers go through the store: any number of ranks.
TEST(ConfigValidate, AsyncCheckpointsAreValidForAnyNumberOfRanks) {
  const std::string async = "checkpoint:\n  async: true\n";
  EXPECT_TRUE(errors(check(async)).empty());
  ValidateOptions two_ranks = without_filesystem();
  two_ranks.world_size = 2;
  EXPECT_TRUE(errors(check(async, {}, two_ranks)).empty());
}

TEST(ConfigValidate, MalformedCombinationsAreErrors) {
  const auto found =
      errors(check("production:\n  validated:\n    - {lr: [5e-4, 1e-4], global_batch: [8]}\n"));
  ASSERT_EQ(found.size(), 2u) << dump(found);
  EXPECT_EQ(found[0].loc.line, 3);
  EXPECT_TRUE(contains(dump(found), "lo must be <= hi")) << dump(found);
  EXPECT_TRUE(contains(dump(found), "exactly 2 values")) << dump(found);
}

TEST(ConfigValidate, ModelVocabularyMustCoverTheData) {
  ValidateOptions options = without_filesystem();
  options.data_vocab_size = 300;
  const auto small = errors(check("model:\n  vocab_size: 256\n", {}, options));
  ASSERT_EQ(small.size(), 1u);
  EXPECT_EQ(small[0].key, "model.vocab_size");
  EXPECT_EQ(small[0].loc.line, 2);
  options.data_vocab_size = 100;
  const auto large = check("model:\n  vocab_size: 256\n", {}, options);
  EXPECT_TRUE(errors(large).empty());
  EXPECT_TRUE(has_warning(large, "model.vocab_size"));
  options.data_vocab_size = 200;
  EXPECT_FALSE(has_warning(check("", {}, options), "model.vocab_size"));
}

// ---- Filesystem
// ------------------------------------------------------------------------------------

std::vector<Diagnostic> check_dir(const std::string& dir,
                                  std::optional<int64_t> parameters = std::nullopt) {
  ValidateOptions options;
  options.parameter_count = parameters;
  return errors(check("", {"checkpoint.dir=" + dir}, options));
}

TEST(ConfigValidate, FilesystemAcceptsAWritableDirectoryWithRoom) {
  const ScratchDir scratch("validate_ok");
  const std::string root = scratch / "ok";
  EXPECT_TRUE(check_dir(root + "/not/yet/created").empty());
  EXPECT_FALSE(std::filesystem::exists(root));  // validation creates nothing
}

TEST(ConfigValidate, FilesystemRefusesTooLittleSpace) {
  const ScratchDir scratch("validate_space");
  const auto found =
      check_dir(scratch / "space", 10'000'000'000'000);  // 12 x 10^13 bytes per checkpoint
  ASSERT_EQ(found.size(), 1u) << dump(found);
  EXPECT_EQ(found[0].key, "checkpoint.dir");
  EXPECT_EQ(found[0].loc.file, "--set");
  EXPECT_TRUE(contains(found[0].message, "TB (6 x")) << found[0].message;
  EXPECT_TRUE(contains(found[0].message, "free")) << found[0].message;
}

TEST(ConfigValidate, FilesystemRefusesAFileInTheWay) {
  const ScratchDir scratch("validate_file");
  const std::string file = scratch / "file";
  std::ofstream(file) << "x";
  const auto found = check_dir(file + "/checkpoints");
  ASSERT_EQ(found.size(), 1u) << dump(found);
  EXPECT_TRUE(contains(found[0].message, "not a directory")) << found[0].message;
}

// `keel train --run-dir DIR` puts checkpoints under DIR, so the check looks there, not at
// run.out_dir/run.name.
TEST(ConfigValidate, FilesystemChecksTheRunDirectoryWhenGiven) {
  const ScratchDir scratch("validate_run_dir");
  const std::string file = scratch / "out_dir_file";
  std::ofstream(file) << "x";
  ValidateOptions options;
  const std::vector<std::string> sets = {"run.out_dir=" + file};
  EXPECT_EQ(errors(check("", sets, options)).size(), 1u);
  options.run_dir = scratch / "run_dir/run";
  EXPECT_TRUE(errors(check("", sets, options)).empty());
}

TEST(ConfigValidate, FilesystemRefusesAnUnwritableParent) {
  if (geteuid() == 0) GTEST_SKIP() << "root can write anywhere";
  const ScratchDir scratch("validate_readonly");
  const std::string dir = scratch / "readonly";
  std::filesystem::create_directory(dir);
  chmod(dir.c_str(), 0555);
  const auto found = check_dir(dir + "/checkpoints");
  chmod(dir.c_str(), 0755);
  ASSERT_EQ(found.size(), 1u) << dump(found);
  EXPECT_TRUE(contains(found[0].message, "not writable")) << found[0].message;
}

// ---- Estimates
// -------------------------------------------------------------------------------------

ModelConfig shape(const std::string& arch, int64_t vocab, int64_t d_model, int64_t layers,
                  int64_t heads, int64_t kv_heads, int64_t d_ff, bool tied, int64_t seq_len) {
  ModelConfig m;
  m.arch = *parse_choice<Arch>(arch);
  m.vocab_size = vocab;
  m.d_model = d_model;
  m.n_layers = layers;
  m.n_heads = heads;
  m.n_kv_heads = kv_heads;
  m.d_ff = d_ff;
  m.tie_embeddings = tied;
  m.seq_len = seq_len;
  m.qk_norm = Switch::kOff;  // the published Llama and GPT-2 models have no q/k norms
  return m;
}

TEST(ConfigEstimate, ParameterCountsMatchPublishedModels) {
  struct Case {
    const char* name;
    ModelConfig model;
    double parameters;
  };
  const std::vector<Case> cases = {
      {"gpt2-124m", shape("gpt2", 50257, 768, 12, 12, 0, 0, true, 1024), 124'439'808},
      {"gpt2-medium", shape("gpt2", 50257, 1024, 24, 16, 0, 0, true, 1024), 354'823'168},
      {"llama-2-7b", shape("llama", 32000, 4096, 32, 32, 0, 11008, false, 4096), 6'738'415'616},
      {"llama-3-8b", shape("llama", 128256, 4096, 32, 32, 8, 14336, false, 8192), 8'030'261'248},
  };
  for (const auto& tc : cases) {
    EXPECT_NEAR(static_cast<double>(parameter_count(tc.model)), tc.parameters, tc.parameters * 0.01)
        << tc.name;
  }
}

// Weights once, AdamW's two moments on every rank (ZeRO-1: once, in parts), Lion's one.
TEST(ConfigEstimate, CheckpointHoldsWeightsAndEveryRanksMoments) {
  Config config;
  const int64_t parameters = parameter_count(config.model);
  EXPECT_EQ(estimate_checkpoint_bytes(config), parameters * 12 + (64 << 10));
  EXPECT_EQ(estimate_checkpoint_bytes(config, 4), parameters * (4 + 4 * 8) + (64 << 10));
  config.distributed.zero = 1;
  EXPECT_EQ(estimate_checkpoint_bytes(config, 4), parameters * 12 + (64 << 10));
  config.distributed.zero = 0;
  config.optim.name = OptimizerName::kLion;
  EXPECT_EQ(estimate_checkpoint_bytes(config, 2), parameters * (4 + 2 * 4) + (64 << 10));
}

}  // namespace
}  // namespace keel::config
