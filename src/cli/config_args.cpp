#include "cli/config_args.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <set>

#include "common/error.h"
#include "data/foreign_formats.h"
#include "data/shard_reader.h"

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

std::vector<config::Diagnostic> check(const config::LoadedConfig& loaded,
                                      config::ValidateOptions& opts) {
  auto diagnostics = loaded.diagnostics;
  const auto source = loaded.config.data.source;
  try {
    if (source == config::DataSource::kShards && !opts.data_vocab_size) {
      const data::DatasetMeta meta = data::read_meta(loaded.config.data.path);
      opts.data_vocab_size = meta.vocab_size;
      int64_t tokens = 0;  // in the train split: what training reads
      if (auto train = meta.splits.find("train"); train != meta.splits.end())
        for (const auto& shard : train->second.shards) tokens += shard.tokens;
      if (tokens == 0)
        throw DataError(loaded.config.data.path +
                        ": the dataset's train split holds no token; HINT: prepare it again from "
                        "inputs that keep documents (prepare's report.txt says what it removed)");
    }
    // Pre-tokenized files: their headers and index, not their tokens (the loader reads those).
    if ((source == config::DataSource::kMegatron || source == config::DataSource::kLlmc) &&
        !loaded.config.data.path.empty())
      data::summarize_foreign(source, loaded.config.data.path);
  } catch (const DataError& e) {
    diagnostics.push_back(
        {config::Diagnostic::Severity::kError, "data.path", loaded.where("data.path"), e.what()});
  }
  std::set<std::string> failed;
  for (const auto& d : loaded.diagnostics)
    if (d.severity == config::Diagnostic::Severity::kError) failed.insert(d.key);
  for (auto& d : config::validate(loaded, opts))
    if (!failed.count(d.key)) diagnostics.push_back(std::move(d));
  config::sort_diagnostics(diagnostics);
  return diagnostics;
}

config::Config resolved(const config::LoadedConfig& loaded,
                        std::optional<int64_t> data_vocab_size) {
  return config::resolve_auto(loaded.config, data_vocab_size);
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
