// keel export CHECKPOINT_DIR --format hf --out DIR: a checkpoint as a Hugging Face model directory
// that transformers' AutoModelForCausalLM and AutoTokenizer load (checkpoint/hf_format.h has the
// mapping):
//   model.safetensors       the weights under transformers' names, fp32, metadata {"format": "pt"}
//   config.json             LlamaForCausalLM | Qwen3ForCausalLM (llama with qk_norm) |
//                           GPT2LMHeadModel
//   generation_config.json  the boundary token as eos (and bos)
//   tokenizer files         from the prepared data the run trained on (data.path's meta.json,
//                           data/hf_tokenizer.h); none for synthetic data, which has no text
// CHECKPOINT_DIR is a step directory, a checkpoints directory or a run directory (then the
// checkpoint LATEST names, with the usual fallback). The weight files and config.yaml are checked
// against MANIFEST.json before they are read; the weights are then written one tensor at a time,
// so the memory export needs is one tensor's. DIR appears whole or not at all: everything is
// written into DIR.tmp-<pid> first, then renamed.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <c10/util/accumulate.h>
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpointer.h"
#include "checkpoint/file_io.h"
#include "checkpoint/hf_format.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/weight_reader.h"
#include "cli/commands.h"
#include "cli/trained_model.h"
#include "common/error.h"
#include "config/load.h"
#include "data/hf_tokenizer.h"

namespace keel::cli {

namespace fs = std::filesystem;

namespace {

struct ExportArgs {
  std::string checkpoint;
  std::string format;
  std::string out;
  std::string tokenizer_from;  // empty: the checkpoint's data.path
  bool no_tokenizer = false;
};

void write_json(const fs::path& path, const nlohmann::json& j) {
  checkpoint::write_new_file(path, j.dump(2) + "\n");
}

// DIR must not exist, or be an empty directory (rename replaces it).
void check_out(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (fs::is_directory(out, ec) && fs::is_empty(out, ec)) return;
  throw UserError("--out " + out.string() +
                  " exists and is not an empty directory; HINT: remove it or pick another --out");
}

// Where the tokenizer comes from: --tokenizer-from, else the data the run trained on; or why
// there is none (the dataset directory empty then).
std::pair<std::string, std::string> tokenizer_source(const ExportArgs& a,
                                                     const config::Config& cfg) {
  std::string data_dir = a.tokenizer_from;
  std::string no_tokenizer_reason;
  if (a.no_tokenizer) {
    no_tokenizer_reason = "--no-tokenizer";
  } else if (data_dir.empty()) {
    if (cfg.data.source == config::DataSource::kSynthetic) {
      no_tokenizer_reason =
          "the run trained on synthetic data (data.source synthetic), which has no text";
    } else if (cfg.data.source != config::DataSource::kShards) {
      no_tokenizer_reason = fmt::format(
          "the run trained on pre-tokenized data (data.source {}), which carries no tokenizer "
          "(--tokenizer-from DATA_DIR exports the one a prepared dataset holds)",
          config::name_of(cfg.data.source));
    } else {
      data_dir = cfg.data.path;
    }
  }
  std::error_code ec;
  if (!data_dir.empty() && !fs::exists(fs::path(data_dir) / "meta.json", ec))
    throw DataError(fmt::format(
        "{}/meta.json: not found, so the tokenizer cannot be exported{}; HINT: pass "
        "--tokenizer-from DATA_DIR (the dataset `keel prepare` wrote), or --no-tokenizer for the "
        "weights alone",
        data_dir, a.tokenizer_from.empty() ? " (data.path of the checkpoint's config)" : ""));
  return {data_dir, no_tokenizer_reason};
}

// The model's parameters in the checkpoint (its rotary buffers, which are not exported, aside).
int64_t parameter_count(const checkpoint::WeightReader& weights) {
  int64_t params = 0;
  for (const auto& [name, shape] : weights.shapes())
    if (name != "rope_cos" && name != "rope_sin") params += c10::multiply_integers(shape);
  return params;
}

int export_hf(const ExportArgs& a) {
  const fs::path dir = find_checkpoint_dir(a.checkpoint);
  const checkpoint::Manifest manifest = checkpoint::read_manifest(dir);

  const std::string yaml = checkpoint::load_text(dir, manifest, "config.yaml");
  const auto loaded = config::load_config_from_string(yaml, (dir / "config.yaml").string());
  for (const auto& d : loaded.diagnostics)
    if (d.severity == config::Diagnostic::Severity::kError && d.key.rfind("model", 0) == 0)
      throw CheckpointError(d.format());
  const config::Config& cfg = loaded.config;
  const config::ModelConfig& m = cfg.model;
  const std::string arch = checkpoint::hf_architecture(m);  // refuses what transformers lacks

  // model.safetensors, or a ZeRO-3 checkpoint's parts (model.rank{r}.safetensors), every file
  // checked against the MANIFEST first, then read one HF tensor at a time: the rows of keel's
  // tensor it holds, from the pieces that hold them (memory for one tensor, at any model size).
  const checkpoint::WeightReader weights(dir);
  const checkpoint::KeelRows rows = [&weights](const std::string& name, int64_t first, int64_t n) {
    std::vector<int64_t> shape = weights.shapes().at(name);
    const int64_t per_row = c10::multiply_integers(shape.begin() + 1, shape.end());
    shape[0] = n;
    return weights.read(name, first * per_row, n * per_row).view(shape);
  };

  const auto [data_dir, no_tokenizer_reason] = tokenizer_source(a, cfg);
  std::error_code ec;
  const fs::path out = fs::path(a.out).lexically_normal();
  check_out(out);
  const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  checkpoint::remove_tree(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw UserError("cannot create " + tmp.string() + ": " + ec.message());
  try {
    checkpoint::HfTokenIds ids;
    std::optional<data::HfTokenizerFiles> tok;
    if (!data_dir.empty()) {
      tok = data::write_hf_tokenizer(data_dir, tmp, m.seq_len);
      if (tok->eos_id >= m.vocab_size || tok->bos_id >= m.vocab_size)
        throw DataError(fmt::format("{}: the tokenizer's ids reach {}, model.vocab_size is {}",
                                    data_dir, std::max(tok->eos_id, tok->bos_id), m.vocab_size));
      ids = {tok->bos_id, tok->eos_id};
    }
    checkpoint::write_hf_weights(tmp / "model.safetensors", m, weights.shapes(), rows,
                                 weights.source());
    write_json(tmp / "config.json", checkpoint::hf_config(m, ids));
    write_json(tmp / "generation_config.json", checkpoint::hf_generation_config(ids));
    checkpoint::fsync_dir(tmp);
    if (::rename(tmp.c_str(), out.c_str()) != 0)
      checkpoint::throw_io_error(out, "cannot rename " + tmp.string() + " to it", errno);
    checkpoint::fsync_dir(fs::absolute(out).parent_path());

    const int64_t params = parameter_count(weights);
    std::cout << fmt::format("exported step {} of {}\n  to {}: {} ({:.2f}M parameters, fp32)\n",
                             manifest.step, fs::absolute(dir).lexically_normal().string(),
                             out.string(), arch, params / 1e6)
              << "  model.safetensors, config.json, generation_config.json\n";
    if (tok) {
      std::cout << fmt::format("  tokenizer ({}, from {}): {}\n", tok->kind, data_dir,
                               fmt::join(tok->files, ", "));
      if (!tok->note.empty()) std::cout << "  note: " << tok->note << "\n";
    } else {
      std::cout << "  no tokenizer files: " << no_tokenizer_reason
                << "; feed token ids to the model directly\n";
    }
    std::cout << fmt::format(
        "load it with: AutoModelForCausalLM.from_pretrained(\"{}\"){}\n", out.string(),
        tok ? fmt::format(", AutoTokenizer.from_pretrained(\"{}\")", out.string()) : "");
  } catch (...) {
    checkpoint::remove_tree(tmp, ec);
    throw;
  }
  return kExitOk;
}

}  // namespace

void register_export(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ExportArgs>();
  auto* sub = app.add_subcommand(
      "export", "write a checkpoint as a Hugging Face transformers model directory");
  sub->add_option("CHECKPOINT_DIR", args->checkpoint,
                  "a step_N directory, a checkpoints directory or a run directory (LATEST)")
      ->required();
  sub->add_option("--format", args->format, "hf: Hugging Face transformers")
      ->required()
      ->check(CLI::IsMember({"hf"}));
  sub->add_option("--out", args->out, "directory to write (must not exist, or be empty)")
      ->required();
  sub->add_option("--tokenizer-from", args->tokenizer_from,
                  "prepared dataset whose tokenizer to export (default: the checkpoint's "
                  "data.path)");
  sub->add_flag("--no-tokenizer", args->no_tokenizer, "export the weights and config only");
  sub->footer(
      "In Python: AutoModelForCausalLM.from_pretrained(\"tiny-hf\"), "
      "AutoTokenizer.from_pretrained(\"tiny-hf\")\n"
      "\n"
      "Examples:\n"
      "  keel export runs/tiny/checkpoints/step_00000400 --format hf --out tiny-hf\n"
      "  keel train configs/tiny.yaml --init-from tiny-hf --run-dir runs/tiny-again   # train on "
      "from it");
  sub->callback([args, &exit_code] { exit_code = export_hf(*args); });
}

}  // namespace keel::cli
