// keel sample CHECKPOINT_DIR --prompt TEXT: text from a trained model, streamed as it is chosen,
// through the run's tokenizer. --dump-logits writes the prompt's logits at every position (JSON),
// for comparing keel's forward with another implementation's (an exported Hugging Face model).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/trained_model.h"
#include "common/error.h"
#include "common/log.h"
#include "model/generate.h"

namespace keel::cli {
namespace {

struct SampleArgs {
  std::string checkpoint, prompt, dump_logits;
  model::GenerateOptions generate;
  bool no_stop = false;
};

// Synthetic data has no text: its prompt is token ids separated by spaces.
std::vector<int64_t> prompt_ids(const TrainedModel& t, const std::string& prompt) {
  std::vector<int64_t> ids;
  if (t.tokenizer) {
    std::vector<uint32_t> encoded;
    t.tokenizer->encode(prompt, encoded);
    ids.assign(encoded.begin(), encoded.end());
    return ids;
  }
  std::istringstream in(prompt);
  std::string word;
  while (in >> word) {
    int64_t id = -1;
    try {
      id = std::stoll(word);
    } catch (const std::exception&) {
    }
    if (id < 0 || id >= t.config.model.vocab_size)
      throw UserError(fmt::format(
          "--prompt: this model was trained on synthetic data, which has no text; give token ids "
          "(0 .. {}) separated by spaces (got '{}')",
          t.config.model.vocab_size - 1, word));
    ids.push_back(id);
  }
  return ids;
}

std::string text_of(const TrainedModel& t, const std::vector<int64_t>& ids) {
  if (t.tokenizer) return t.tokenizer->decode(ids.data(), ids.size());
  std::string out;
  for (int64_t id : ids) out += (out.empty() ? "" : " ") + std::to_string(id);
  return out;
}

void dump_logits(const TrainedModel& t, const std::vector<int64_t>& ids, const std::string& path) {
  torch::NoGradGuard no_grad;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(ids.size()), t.config.model.seq_len);
  const auto tokens =
      torch::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + n), torch::kLong).unsqueeze(0);
  model::Transformer m = t.model;  // the holder is const; the module is not
  const auto logits = m->forward(tokens).squeeze(0).to(torch::kFloat).contiguous();  // (n, V)
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits[i].data_ptr<float>();
    rows.push_back(std::vector<float>(row, row + logits.size(1)));
  }
  std::ofstream out(path);
  out << nlohmann::json{
      {"ids", std::vector<int64_t>(ids.begin(), ids.begin() + n)},
      {"logits",
       rows}}.dump();
  if (!out) throw UserError("--dump-logits: cannot write " + path);
}

int sample(const SampleArgs& a) {
  TrainedModel t = load_trained_model(a.checkpoint);
  const auto ids = prompt_ids(t, a.prompt);
  if (ids.empty()) throw UserError("--prompt: the prompt encodes to no tokens; give some text");
  if (!a.dump_logits.empty()) dump_logits(t, ids, a.dump_logits);
  model::GenerateOptions o = a.generate;
  if (t.tokenizer && !a.no_stop) o.stop_id = t.tokenizer->boundary_id();
  log::info("sample", "{} (step {}), {} prompt tokens, temperature {}, top-k {}, seed {}",
            t.checkpoint.string(), t.step, ids.size(), o.temperature, o.top_k, o.seed);
  std::cout << a.prompt << std::flush;
  std::vector<int64_t> pending;  // ids not yet printed: a UTF-8 character may span several
  model::generate(t.model, ids, o, [&](int64_t id) {
    if (o.stop_id && id == *o.stop_id) return;
    pending.push_back(id);
    const std::string text = text_of(t, pending);
    if (!t.tokenizer) {
      std::cout << " " << text << std::flush;
      pending.clear();
    } else if (text.find("\xef\xbf\xbd") == std::string::npos) {  // no replacement character
      std::cout << text << std::flush;
      pending.clear();
    }
  });
  if (!pending.empty()) std::cout << text_of(t, pending);
  std::cout << "\n";
  return kExitOk;
}

}  // namespace

void register_sample(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<SampleArgs>();
  auto* sub = app.add_subcommand("sample", "generate text from a trained checkpoint");
  sub->add_option("CHECKPOINT_DIR", a->checkpoint,
                  "a step_N directory, a checkpoints directory or a run directory (LATEST)")
      ->required();
  sub->add_option("--prompt", a->prompt, "the text to continue")->required();
  sub->add_option("--tokens", a->generate.max_new_tokens, "new tokens at most")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--temperature", a->generate.temperature, "0 = greedy (deterministic)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--top-k", a->generate.top_k, "sample among the K most likely (0 = all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--seed", a->generate.seed, "sampling seed")->capture_default_str();
  sub->add_flag("--no-stop", a->no_stop, "go on past the document boundary token");
  sub->add_option("--dump-logits", a->dump_logits,
                  "write the prompt's logits at every position to FILE (JSON {ids, logits})");
  sub->footer(
      "A model trained on text continues text; one trained on the synthetic chain "
      "(configs/tiny.yaml) "
      "takes token ids.\n"
      "\n"
      "Examples:\n"
      "  keel sample runs/fortunes --prompt 'Once upon a time' --tokens 100 --temperature 0.8 "
      "--top-k 40\n"
      "  keel sample runs/tiny/checkpoints/step_00000400 --prompt '1 2 3' --temperature 0   # "
      "greedy");
  sub->callback([a, &exit_code] {
    log::init(0, 1);
    exit_code = sample(*a);
  });
}

}  // namespace keel::cli
