// Tests of config/load: YAML into typed structs with locations, type errors and unknown keys as
// diagnostics, --set overrides, the production lock, to_yaml round trips, Diagnostic::format.
#include "config/load.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>
#include <vector>

#include "common/error.h"
#include "scratch_dir.h"

namespace keel::config {
namespace {

using keel::testing::ScratchDir;

LoadedConfig load(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return load_config_from_string(text, "test.yaml", overrides);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- Reading
// ---------------------------------------------------------------------------------------

TEST(ConfigLoad, EmptyFileGivesDefaults) {
  for (const std::string text : {"", "# nothing but a comment\n", "run:\n"}) {
    const LoadedConfig loaded = load(text);
    EXPECT_TRUE(loaded.diagnostics.empty()) << text;
    EXPECT_EQ(loaded.config, Config{}) << text;
  }
}

// A path that is not a config file: a directory (it would open and read as an empty config, the
// defaults) is refused naming its YAML files; a missing file names the one beside it that it most
// likely meant (tiny.yml for tiny.yaml).
TEST(ConfigLoad, ADirectoryOrAMissingFileIsRefusedNamingTheConfigMeant) {
  const ScratchDir dir("config_paths");
  std::ofstream(dir.path() / "tiny.yaml") << "run:\n  max_steps: 5\n";
  const auto message_of = [](const std::string& path) -> std::string {
    try {
      load_config(path, {});
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(loaded)";
  };
  const std::string directory = message_of(dir.str());
  EXPECT_NE(directory.find("a directory, not a config file"), std::string::npos) << directory;
  EXPECT_NE(directory.find("tiny.yaml"), std::string::npos) << directory;
  const std::string yml = message_of((dir.path() / "tiny.yml").string());
  EXPECT_NE(yml.find("did you mean " + (dir.path() / "tiny.yaml").string() + "?"),
            std::string::npos)
      << yml;
  EXPECT_EQ(yml.find("error:"), std::string::npos) << "main() says error: once";
}

TEST(ConfigLoad, ReadsEveryKindOfFieldAndRemembersWhere) {
  const LoadedConfig loaded = load(
      "run:\n"
      "  name: exp1\n"
      "  max_steps: 5000\n"
      "  deterministic: true\n"
      "optim:\n"
      "  lr: 1.5e-3\n"
      "  betas: [0.8, 0.99]\n"
      "  no_decay: [bias]\n"
      "data:\n"
      "  loader:\n"
      "    workers: 4\n"
      "production:\n"
      "  validated:\n"
      "    - {lr: [1e-4, 2e-3], global_batch: [8, 64]}\n"
      "faults:\n"
      "  - kind: nan_grad\n"
      "    at_step: 7\n");
  ASSERT_TRUE(loaded.diagnostics.empty()) << loaded.diagnostics[0].format();
  const Config& c = loaded.config;
  EXPECT_EQ(c.run.name, "exp1");
  EXPECT_EQ(c.run.max_steps, 5000);
  EXPECT_TRUE(c.run.deterministic);
  EXPECT_EQ(c.optim.lr, 1.5e-3);
  EXPECT_EQ(c.optim.betas, (std::vector<double>{0.8, 0.99}));
  EXPECT_EQ(c.optim.no_decay, (std::vector<std::string>{"bias"}));
  EXPECT_EQ(c.data.loader.workers, 4);
  EXPECT_EQ(c.data.loader.queue_capacity,
            LoaderConfig{}.queue_capacity);  // missing keys keep defaults
  ASSERT_EQ(c.production.validated.size(), 1u);
  EXPECT_EQ(c.production.validated[0].global_batch, (std::vector<double>{8, 64}));
  ASSERT_EQ(c.faults.size(), 1u);
  EXPECT_EQ(c.faults[0].kind, FaultKind::kNanGrad);
  EXPECT_EQ(c.faults[0].at_step, 7);
  EXPECT_EQ(c.faults[0].steps, FaultSpec{}.steps);

  const SourceLoc lr = loaded.where("optim.lr");
  EXPECT_EQ(lr.file, "test.yaml");
  EXPECT_EQ(lr.line, 6);
  EXPECT_EQ(lr.column, 7);
  EXPECT_EQ(loaded.where("faults[0].at_step").line, 17);
  EXPECT_EQ(loaded.where("data.loader.workers").line, 11);
}

TEST(ConfigLoad, WhereFallsBackToAncestorThenFileStart) {
  const LoadedConfig loaded = load("optim:\n  lr: 0.001\n");
  EXPECT_EQ(loaded.where("optim.eps").line, 1);  // unset key: its section's line
  const SourceLoc nowhere = loaded.where("model.d_model");
  EXPECT_EQ(nowhere.file, "test.yaml");
  EXPECT_EQ(nowhere.line, 1);
  EXPECT_EQ(nowhere.column, 1);
}

TEST(ConfigLoad, AcceptsAnIntegerWrittenAsAnExactFloat) {
  const LoadedConfig loaded = load("run:\n  max_steps: 1e5\n");
  EXPECT_TRUE(loaded.diagnostics.empty());
  EXPECT_EQ(loaded.config.run.max_steps, 100000);
}

struct TypeErrorCase {
  std::string yaml;
  std::string key;
  int line;
  int column;
  std::string message_part;
};

TEST(ConfigLoad, TypeErrorsNameTheExpectedTypeAndPointAtTheValue) {
  const std::vector<TypeErrorCase> cases = {
      {"optim:\n  lr: abc\n", "optim.lr", 2, 7, "must be a number (got 'abc')"},
      {"optim:\n  lr: \"3e-4\"\n", "optim.lr", 2, 7, "must be a number (got the quoted string"},
      {"schedule:\n  warmup_steps: 100.5\n", "schedule.warmup_steps", 2, 17,
       "must be auto or an integer"},
      {"model:\n  d_model: big\n", "model.d_model", 2, 12, "must be an integer (got 'big')"},
      {"run:\n  deterministic: abc\n", "run.deterministic", 2, 18, "must be true or false"},
      {"run:\n  name: [a, b]\n", "run.name", 2, 9, "must be a string (got a list)"},
      {"optim:\n  betas: 0.9\n", "optim.betas", 2, 10, "must be a list of numbers"},
      {"optim:\n  betas: [0.9, x]\n", "optim.betas[1]", 2, 16, "must be a number (got 'x')"},
      {"optim:\n  no_decay: [bias, [x]]\n", "optim.no_decay[1]", 2, 20, "must be a string"},
      {"run: 5\n", "run", 1, 6, "must be a section"},
      {"data:\n  loader: [1]\n", "data.loader", 2, 11, "must be a section"},
      {"faults: {kind: crash}\n", "faults", 1, 9, "must be a list of maps"},
      {"faults:\n  - crash\n", "faults[0]", 2, 5, "must be a map"},
      {"production:\n  validated: [{lr: [1e-4, x]}]\n", "production.validated[0].lr[1]", 2, 27,
       "must be a number"},
      {"run:\n  max_steps:\n", "run.max_steps", 2, 3, "must be an integer (got nothing)"},
  };
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.yaml);
    const LoadedConfig loaded = load(tc.yaml);
    ASSERT_EQ(loaded.diagnostics.size(), 1u);
    const Diagnostic& d = loaded.diagnostics[0];
    EXPECT_EQ(d.severity, Diagnostic::Severity::kError);
    EXPECT_EQ(d.key, tc.key);
    EXPECT_EQ(d.loc.file, "test.yaml");
    EXPECT_EQ(d.loc.line, tc.line);
    EXPECT_EQ(d.loc.column, tc.column);
    EXPECT_TRUE(contains(d.message, tc.message_part)) << d.message;
    EXPECT_TRUE(loaded.has_errors());
  }
}

TEST(ConfigLoad, AWrongValueKeepsTheDefault) {
  const LoadedConfig loaded = load("optim:\n  lr: abc\n  eps: 1e-6\n");
  EXPECT_EQ(loaded.config.optim.lr, OptimConfig{}.lr);
  EXPECT_EQ(loaded.config.optim.eps, 1e-6);
}

struct UnknownKeyCase {
  std::string yaml;
  std::string key;
  int line;
  int column;
  std::string suggestion;  // "" = no did-you-mean expected
};

TEST(ConfigLoad, UnknownKeysAreErrorsWithDidYouMean) {
  const std::vector<UnknownKeyCase> cases = {
      {"optim:\n  lrr: 0.1\n", "optim.lrr", 2, 3, "(did you mean optim.lr?)"},
      {"run:\n  max_step: 5\n", "run.max_step", 2, 3, "(did you mean run.max_steps?)"},
      {"schedule:\n  lr: 0.1\n", "schedule.lr", 2, 3, "(did you mean optim.lr?)"},
      {"optimizer:\n  lr: 0.1\n", "optimizer", 1, 1, "(did you mean optim?)"},
      {"loader:\n  workers: 2\n", "loader", 1, 1, "(did you mean data.loader?)"},
      {"faults:\n  - kind: crash\n    at_stp: 3\n", "faults[0].at_stp", 3, 5,
       "(did you mean faults[0].at_step?)"},
      {"run:\n  zzzzzzzzzz: 1\n", "run.zzzzzzzzzz", 2, 3, ""},
  };
  for (const auto& tc : cases) {
    SCOPED_TRACE(tc.yaml);
    const LoadedConfig loaded = load(tc.yaml);
    ASSERT_EQ(loaded.diagnostics.size(), 1u);
    const Diagnostic& d = loaded.diagnostics[0];
    EXPECT_EQ(d.key, tc.key);
    EXPECT_EQ(d.loc.line, tc.line);
    EXPECT_EQ(d.loc.column, tc.column);
    EXPECT_TRUE(contains(d.message, "unknown key")) << d.message;
    if (tc.suggestion.empty()) {
      EXPECT_FALSE(contains(d.message, "did you mean")) << d.message;
    } else {
      EXPECT_TRUE(contains(d.message, tc.suggestion)) << d.message;
    }
  }
}

TEST(ConfigLoad, EveryMistakeIsReportedNotJustTheFirst) {
  const LoadedConfig loaded = load("run:\n  max_stepz: 1\n  seed: x\noptim:\n  lr: y\nbogus: 1\n");
  EXPECT_EQ(loaded.diagnostics.size(), 4u);
}

TEST(ConfigLoad, ADuplicateKeyIsAnError) {
  const LoadedConfig loaded = load("optim:\n  lr: 0.1\n  lr: 0.2\n");
  ASSERT_EQ(loaded.diagnostics.size(), 1u);
  EXPECT_EQ(loaded.diagnostics[0].loc.line, 3);
  EXPECT_TRUE(contains(loaded.diagnostics[0].message, "given twice"))
      << loaded.diagnostics[0].message;
}

TEST(ConfigLoad, ATopLevelThatIsNotAMapIsAnError) {
  EXPECT_TRUE(load("- a\n- b\n").has_errors());
  EXPECT_TRUE(load("just text\n").has_errors());
}

TEST(ConfigLoad, SyntaxErrorThrowsWithFileLineColumn) {
  try {
    load("run:\n  name: x\noptim:\n  betas: [0.9, 0.95\n");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.starts_with("test.yaml:")) << message;
    EXPECT_TRUE(contains(message, "not valid YAML")) << message;
    int line = 0, column = 0;
    ASSERT_EQ(std::sscanf(message.c_str(), "test.yaml:%d:%d:", &line, &column), 2) << message;
    EXPECT_GE(line, 4);
    EXPECT_GE(column, 1);
  }
}

TEST(ConfigLoad, UnreadableFileThrows) {
  EXPECT_THROW(load_config("/nonexistent/keel/config.yaml"), ConfigError);
}

TEST(ConfigLoad, LoadsAFileAndNamesItInLocations) {
  const ScratchDir dir("config_load");
  const std::string path = dir / "config.yaml";
  {
    std::ofstream file(path);
    file << "model:\n  arch: gpt2\n  d_model: 64\n";
  }
  const LoadedConfig loaded = load_config(path, {"model.n_layers=3"});
  EXPECT_TRUE(loaded.diagnostics.empty());
  EXPECT_EQ(loaded.path, path);
  EXPECT_EQ(loaded.config.model.arch, Arch::kGpt2);
  EXPECT_EQ(loaded.config.model.n_layers, 3);
  EXPECT_EQ(loaded.where("model.d_model").file, path);
  EXPECT_EQ(loaded.where("model.d_model").line, 3);
}

// ---- --set overrides
// -------------------------------------------------------------------------------

TEST(ConfigOverride, AppliesScalarsListsAndBoolsOnTopOfTheFile) {
  const LoadedConfig loaded =
      load("optim:\n  lr: 0.001\n  betas: [0.9, 0.95]\n",
           {"optim.lr=2e-3", "optim.betas=[0.9,0.999]", "run.deterministic=true", "run.name=my run",
            "optim.no_decay=[]", "data.loader.workers=3"});
  ASSERT_TRUE(loaded.diagnostics.empty()) << loaded.diagnostics[0].format();
  const Config& c = loaded.config;
  EXPECT_EQ(c.optim.lr, 2e-3);
  EXPECT_EQ(c.optim.betas, (std::vector<double>{0.9, 0.999}));
  EXPECT_TRUE(c.run.deterministic);
  EXPECT_EQ(c.run.name, "my run");
  EXPECT_TRUE(c.optim.no_decay.empty());
  EXPECT_EQ(c.data.loader.workers, 3);
  const SourceLoc lr = loaded.where("optim.lr");
  EXPECT_EQ(lr.file, "--set");
  EXPECT_EQ(lr.line, 0);
  EXPECT_EQ(lr.column, 1);
  EXPECT_EQ(loaded.where("optim.betas").column, 2);
  EXPECT_EQ(loaded.where("optim.eps").file, "test.yaml");  // not overridden: the section's line
}

TEST(ConfigOverride, LaterFlagsWin) {
  const LoadedConfig loaded = load("", {"run.seed=1", "run.seed=2"});
  EXPECT_EQ(loaded.config.run.seed, 2);
  EXPECT_EQ(loaded.where("run.seed").column, 2);
}

TEST(ConfigOverride, SetsTheFaultsListWholesale) {
  const LoadedConfig loaded =
      load("faults:\n  - {kind: crash, at_step: 1}\n  - {kind: crash, at_step: 2}\n",
           {"faults=[{kind: nan_grad, at_step: 5}]"});
  ASSERT_TRUE(loaded.diagnostics.empty()) << loaded.diagnostics[0].format();
  ASSERT_EQ(loaded.config.faults.size(), 1u);
  EXPECT_EQ(loaded.config.faults[0].kind, FaultKind::kNanGrad);
  EXPECT_EQ(loaded.config.faults[0].at_step, 5);
  EXPECT_EQ(loaded.where("faults[1].kind").file, "--set");  // the old second item is gone
}

TEST(ConfigOverride, UnknownKeyIsAnErrorWithDidYouMean) {
  const LoadedConfig loaded = load("", {"run.seed=3", "optim.lrr=0.1"});
  const Diagnostic d = loaded.diagnostics.size() == 1 ? loaded.diagnostics[0] : Diagnostic{};
  ASSERT_EQ(loaded.diagnostics.size(), 1u);
  EXPECT_EQ(d.key, "optim.lrr");
  EXPECT_EQ(d.loc.file, "--set");
  EXPECT_EQ(d.loc.column, 2);
  EXPECT_EQ(d.format(), "--set[2]: error: optim.lrr: unknown key 'lrr' (did you mean optim.lr?)");
}

TEST(ConfigOverride, MalformedFlagsAreErrors) {
  for (const std::string flag : {"optim.lr", "=3", "optim..lr=1", "optim.lr=abc", "optim.lr=[1"}) {
    SCOPED_TRACE(flag);
    const LoadedConfig loaded = load("", {flag});
    ASSERT_EQ(loaded.diagnostics.size(), 1u);
    EXPECT_EQ(loaded.diagnostics[0].loc.file, "--set");
    EXPECT_EQ(loaded.config.optim.lr, OptimConfig{}.lr);
  }
}

// ---- The production lock
// ---------------------------------------------------------------------------

const char* kLocked = "production:\n  locked: true\noptim:\n  lr: 0.001\n";

TEST(ConfigLock, RefusesOverridesOfLockedKeys) {
  for (const std::string flag :
       {"optim.lr=0.01", "schedule.warmup_steps=5", "stability.rollback.enabled=false",
        "run.precision=fp16", "data.micro_batch_size=64", "optim={lr: 0.01}"}) {
    SCOPED_TRACE(flag);
    const LoadedConfig loaded = load(kLocked, {flag});
    ASSERT_EQ(loaded.diagnostics.size(), 1u);
    const Diagnostic& d = loaded.diagnostics[0];
    EXPECT_EQ(d.loc.file, "--set");
    EXPECT_TRUE(contains(d.message, "locked")) << d.message;
    EXPECT_EQ(d.key, flag.substr(0, flag.find('=')));
    EXPECT_EQ(loaded.config.optim.lr, 0.001);
  }
  const LoadedConfig lr = load(kLocked, {"optim.lr=0.01"});
  EXPECT_TRUE(contains(lr.diagnostics.at(0).message, "'optim.*'")) << lr.diagnostics.at(0).message;
}

TEST(ConfigLock, AllowsOverridesOfUnlockedKeys) {
  const LoadedConfig loaded = load(kLocked, {"run.max_steps=10", "logging.every_steps=1"});
  EXPECT_TRUE(loaded.diagnostics.empty());
  EXPECT_EQ(loaded.config.run.max_steps, 10);
}

TEST(ConfigLock, ASetCannotUnlock) {
  for (const std::string flag :
       {"production.locked=false", "production.locked_keys=[]", "production={locked: false}"}) {
    SCOPED_TRACE(flag);
    const LoadedConfig loaded = load(kLocked, {flag, "optim.lr=0.01"});
    EXPECT_EQ(loaded.diagnostics.size(), 2u);
    EXPECT_TRUE(loaded.config.production.locked);
    EXPECT_EQ(loaded.config.optim.lr, 0.001);
  }
}

TEST(ConfigLock, RefusesFaults) {
  const LoadedConfig by_flag = load(kLocked, {"faults=[{kind: crash, at_step: 3}]"});
  ASSERT_EQ(by_flag.diagnostics.size(), 1u);
  EXPECT_TRUE(
      contains(by_flag.diagnostics[0].message, "faults are refused in a production config"));
  EXPECT_TRUE(by_flag.config.faults.empty());

  const LoadedConfig in_file = load(std::string(kLocked) + "faults:\n  - kind: crash\n");
  ASSERT_EQ(in_file.diagnostics.size(), 1u);
  EXPECT_EQ(in_file.diagnostics[0].key, "faults");
  EXPECT_EQ(in_file.diagnostics[0].loc.line, 5);
  EXPECT_TRUE(
      contains(in_file.diagnostics[0].message, "faults are refused in a production config"));
}

TEST(ConfigLock, UsesTheFilesLockedKeys) {
  const std::string text = "production:\n  locked: true\n  locked_keys: [run.seed]\n";
  EXPECT_TRUE(load(text, {"run.seed=9"}).has_errors());
  EXPECT_FALSE(load(text, {"optim.lr=0.01"}).has_errors());
}

TEST(ConfigLock, AnUnlockedConfigAcceptsEverything) {
  const LoadedConfig loaded =
      load("", {"optim.lr=0.01", "production.locked_keys=[]", "faults=[{kind: crash}]"});
  EXPECT_TRUE(loaded.diagnostics.empty());
}

struct MatchCase {
  std::string pattern;
  std::string key;
  bool matches;
};

TEST(ConfigKeys, KeyMatchesPatterns) {
  const std::vector<MatchCase> cases = {
      {"optim.*", "optim.lr", true},
      {"optim.*", "optim.betas", true},
      {"optim.*", "optim", false},
      {"optim.*", "optimx.lr", false},
      {"stability.*", "stability.rollback.enabled", true},
      {"run.precision", "run.precision", true},
      {"run.precision", "run.precision_x", false},
      {"run.precision", "run", false},
      {"data.micro_batch_size", "data.grad_accum_steps", false},
  };
  for (const auto& tc : cases)
    EXPECT_EQ(key_matches(tc.pattern, tc.key), tc.matches) << tc.pattern << " vs " << tc.key;
}

TEST(ConfigKeys, AllKeyPathsListsLeavesAndLists) {
  const std::vector<std::string> paths = all_key_paths();
  for (const std::string expected :
       {"run.name", "optim.betas", "data.loader.workers", "stability.recovery.lr_factor",
        "production.validated", "faults"}) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), expected), paths.end()) << expected;
  }
  EXPECT_EQ(std::find(paths.begin(), paths.end(), "data.loader"), paths.end());
}

// ---- to_yaml
// ---------------------------------------------------------------------------------------

Config unusual_config() {
  Config c;
  c.run.name = "quote\" backslash\\ colon: # hash\nnewline\ttab";
  c.run.out_dir = "";
  c.run.seed = -42;
  c.run.max_steps = 9'000'000'000;
  c.run.deterministic = true;
  c.model.arch = Arch::kGpt2;
  c.model.dropout = 0.1 + 0.2;  // 0.30000000000000004: needs all 17 digits
  c.model.init_std = 5e-324;
  c.model.z_loss = 1e-300;
  c.optim.betas = {0.9, 0.999, 1.0 / 3.0};
  c.optim.no_decay = {};
  c.optim.lr = 123456.789e10;
  c.data.path = "true";  // a string that would read back as a bool if written plainly
  c.data.val_path = "123";
  c.checkpoint.dir = "~";
  c.production.locked_keys = {"optim.*", "yes", "null"};
  c.production.validated = {{{1e-4, 6e-4}, {32, 128}}, {{0.1}, {}}};
  c.faults = {{FaultKind::kCorruptBatch, 10, 2, CorruptMode::kShuffled, 0.5, 0.0},
              {FaultKind::kLoaderStall, 3, 1, {}, 1.0, 2.5}};
  return c;
}

TEST(ConfigYaml, RoundTripsExactly) {
  for (const Config& original : {Config{}, unusual_config()}) {
    const std::string text = to_yaml(original);
    const LoadedConfig reloaded = load(text);
    ASSERT_TRUE(reloaded.diagnostics.empty()) << reloaded.diagnostics[0].format() << "\n" << text;
    EXPECT_EQ(reloaded.config, original) << text;
    EXPECT_EQ(to_yaml(reloaded.config), text);
  }
}

// `auto` is a value of its own for the keys that take it; it reads back as kAuto and is written
// as `auto`. -1 (kAuto's representation) is not a number a user can write.
TEST(ConfigLoad, AutoKeysReadAndWriteAuto) {
  const LoadedConfig loaded = load(
      "model:\n  vocab_size: auto\ncheckpoint:\n  every_steps: 250\n  stable:\n"
      "    every_steps: auto\n");
  ASSERT_TRUE(loaded.diagnostics.empty()) << loaded.diagnostics[0].format();
  EXPECT_EQ(loaded.config.model.vocab_size, kAuto);
  EXPECT_EQ(loaded.config.checkpoint.every_steps, 250);
  EXPECT_EQ(loaded.config.checkpoint.stable.every_steps, kAuto);
  const std::string text = to_yaml(loaded.config);
  EXPECT_TRUE(contains(text, "  vocab_size: auto\n")) << text;
  EXPECT_TRUE(contains(text, "  every_steps: 250\n")) << text;
  for (const char* bad : {"model:\n  vocab_size: -1\n", "model:\n  vocab_size: automatic\n"}) {
    const LoadedConfig wrong = load(bad);
    ASSERT_EQ(wrong.diagnostics.size(), 1u) << bad;
    EXPECT_TRUE(contains(wrong.diagnostics[0].message, "must be auto or"))
        << wrong.diagnostics[0].message;
  }
  // The resolved config: the data's vocabulary padded to 64, the config-only autos as numbers.
  Config resolved = resolve_auto(loaded.config, 257);
  EXPECT_EQ(resolved.model.vocab_size, 320);
  EXPECT_EQ(resolved.schedule.warmup_steps, 100);  // max_steps 1000 / 10
  EXPECT_EQ(resolved.stability.recovery.steps, 50);
  EXPECT_EQ(resolved.checkpoint.stable.every_steps, kAuto);  // measured by the run
}

// model.qk_norm was a bool: true and false (yes, no) still read, as on and off. auto resolves by
// arch (issue 47: on for llama, off for gpt2) and is written as the choice made.
TEST(ConfigLoad, QkNormReadsTheOldBoolsAndResolvesAutoByArch) {
  const std::vector<std::pair<std::string, Switch>> cases = {
      {"true", Switch::kOn}, {"false", Switch::kOff}, {"yes", Switch::kOn},
      {"on", Switch::kOn},   {"off", Switch::kOff},   {"auto", Switch::kAuto}};
  for (const auto& [text, want] : cases) {
    const LoadedConfig loaded = load("model:\n  qk_norm: " + text + "\n");
    ASSERT_TRUE(loaded.diagnostics.empty()) << text << ": " << loaded.diagnostics[0].format();
    EXPECT_EQ(loaded.config.model.qk_norm, want) << text;
    EXPECT_EQ(load("", {"model.qk_norm=" + text}).config.model.qk_norm, want) << text;
  }
  const LoadedConfig quoted = load("model:\n  qk_norm: \"true\"\n");
  ASSERT_EQ(quoted.diagnostics.size(), 1u);
  EXPECT_TRUE(contains(quoted.diagnostics[0].message, "must be one of auto|on|off"))
      << quoted.diagnostics[0].message;

  Config llama, gpt2, off;
  gpt2.model.arch = Arch::kGpt2;
  off.model.qk_norm = Switch::kOff;
  EXPECT_EQ(llama.model.qk_norm, Switch::kAuto);
  EXPECT_TRUE(qk_norm_on(llama.model));
  EXPECT_FALSE(qk_norm_on(gpt2.model));
  EXPECT_EQ(resolve_auto(llama, std::nullopt).model.qk_norm, Switch::kOn);
  EXPECT_EQ(resolve_auto(gpt2, std::nullopt).model.qk_norm, Switch::kOff);
  EXPECT_EQ(resolve_auto(off, std::nullopt).model.qk_norm, Switch::kOff);
  const std::string text = to_yaml(resolve_auto(gpt2, std::nullopt));
  EXPECT_TRUE(contains(text, "  qk_norm: \"off\"\n")) << text;
  EXPECT_EQ(load(text).config.model.qk_norm, Switch::kOff);
}

TEST(ConfigYaml, WritesEveryKeyInBlockStyleWithFlowLists) {
  const std::string text = to_yaml(Config{});
  const LoadedConfig reloaded = load(text);
  for (const auto& path : all_key_paths()) EXPECT_EQ(reloaded.locations.count(path), 1u) << path;
  EXPECT_TRUE(contains(text, "optim:\n  name: \"adamw\"\n  lr: ")) << text;
  EXPECT_TRUE(contains(text, "\n  betas: [0.9, 0.95]\n")) << text;
  EXPECT_TRUE(contains(text, "faults: []\n")) << text;
  Config with_fault;
  with_fault.faults.emplace_back();
  with_fault.faults[0].kind = FaultKind::kCrash;
  with_fault.faults[0].at_step = 4;
  EXPECT_TRUE(contains(to_yaml(with_fault), "faults:\n  - kind: \"crash\"\n    at_step: 4\n"))
      << to_yaml(with_fault);
}

// ---- Diagnostic::format and schema helpers
// ---------------------------------------------------------

TEST(ConfigDiagnostic, FormatsFileAndFlagLocations) {
  const Diagnostic in_file{
      Diagnostic::Severity::kError, "optim.lr", {"c.yaml", 4, 7}, "must be > 0"};
  EXPECT_EQ(in_file.format(), "c.yaml:4:7: error: optim.lr: must be > 0");
  const Diagnostic warning{
      Diagnostic::Severity::kWarning, "run.precision", {"c.yaml", 2, 3}, "fp16"};
  EXPECT_EQ(warning.format(), "c.yaml:2:3: warning: run.precision: fp16");
  const Diagnostic flag{Diagnostic::Severity::kError, "optim.lr", {"--set", 0, 2}, "locked"};
  EXPECT_EQ(flag.format(), "--set[2]: error: optim.lr: locked");
  const Diagnostic no_key{Diagnostic::Severity::kError, "", {"c.yaml", 1, 1}, "bad"};
  EXPECT_EQ(no_key.format(), "c.yaml:1:1: error: bad");
}

TEST(ConfigSchema, DerivesFeedForwardWidthAndKvHeads) {
  ModelConfig llama;
  llama.d_model = 4096;
  EXPECT_EQ(effective_d_ff(llama), 10944);  // 10922 rounded up to 64 (Llama-2 rounds to 256: 11008)
  llama.d_model = 128;
  EXPECT_EQ(effective_d_ff(llama), 384);  // 341 rounded up to 64
  ModelConfig gpt2;
  gpt2.arch = Arch::kGpt2;
  gpt2.d_model = 768;
  EXPECT_EQ(effective_d_ff(gpt2), 3072);
  gpt2.d_ff = 1000;
  EXPECT_EQ(effective_d_ff(gpt2), 1000);
  EXPECT_EQ(effective_kv_heads(llama), llama.n_heads);
  llama.n_kv_heads = 2;
  EXPECT_EQ(effective_kv_heads(llama), 2);
}

}  // namespace
}  // namespace keel::config
