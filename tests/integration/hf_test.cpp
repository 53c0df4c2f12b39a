// `keel export --format hf` and `keel train --init-from`, checked against the real Hugging Face
// transformers (the venv scripts/setup.sh makes; tests/tools/hf_check.py): every model flavour's
// logits agree with keel's within 1e-4, the tokenizers encode as keel's do, export -> init-from ->
// export gives the same bytes, and wrong input exits 2 naming what is wrong.
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "checkpoint/file_io.h"
#include "checkpoint/tensor_file.h"
#include "config/load.h"
#include "data/tokenizer.h"
#include "harness.h"
#include "model/transformer.h"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kLogitsTolerance = 1e-4;
const std::string kPrompt = "the quick brown fox";
const std::string kLongPrompt = "the quick brown fox jumps over";  // 30 bytes: within seq_len 32

// The venv's python, with transformers importable; empty (and the test failed) otherwise: the
// environment scripts/setup.sh makes has it, so its absence is a broken setup, not a skip.
std::string hf_python() {
  static const std::string python = [] {
    const std::string py = setup_env_program("python");
    if (py.empty()) return std::string();
    auto r = run_shell(py + " -c 'import transformers, tokenizers, safetensors, sentencepiece'");
    return r.exit_code == 0 ? py : std::string();
  }();
  EXPECT_FALSE(python.empty())
      << "no python with transformers, tokenizers, safetensors and sentencepiece in the "
         "environment scripts/setup.sh makes (~/.cache/keel/torch-2.11.0 or $KEEL_CACHE); "
         "HINT: run scripts/setup.sh";
  return python;
}

// A small English-like corpus, documents separated by "%" lines (deterministic).
void write_corpus(const fs::path& file) {
  const char* subjects[] = {"the quick brown fox", "a lazy dog",  "the old keeper", "my cat",
                            "the tired engineer",  "a small bird"};
  const char* verbs[] = {"jumps over",  "looks at", "runs past",
                         "sleeps near", "sings to", "waits for"};
  const char* objects[] = {"the fence",      "a red barn",     "the river",
                           "the quiet town", "an open window", "the green hill"};
  std::mt19937 rng(11);
  std::ofstream out(file);
  for (int doc = 0; doc < 400; ++doc) {
    const int sentences = 2 + static_cast<int>(rng() % 4);
    for (int s = 0; s < sentences; ++s)
      out << subjects[rng() % 6] << " " << verbs[rng() % 6] << " " << objects[rng() % 6]
          << (s + 1 < sentences ? ", and " : ".\n");
    out << "%\n";
  }
}

// `keel prepare` of the corpus with `tokenizer` (byte | spm-train:N) into dir/data.
std::string prepare(const ScratchDir& dir, const std::string& tokenizer) {
  write_corpus(dir / "corpus.txt");
  auto r = run_keel("prepare --input " + (dir / "corpus.txt") + " --output " + (dir / "data") +
                    " --tokenizer " + tokenizer +
                    " --separator % --seq-len 32 --val-fraction 0.05 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir / "data";
}

// Trains a tiny model a few dozen steps on `data` (or the synthetic chain when empty), so that the
// weights are far from their initialisation.
std::string train(const ScratchDir& dir, const std::string& name, const std::string& data,
                  const std::string& sets) {
  const std::string run = dir / name;
  const std::string source = data.empty() ? ""
                                          : " --set data.source=shards --set data.path=" + data +
                                                " --set model.vocab_size=auto";
  // The guard is off: these runs only need weights away from their initialisation, and a tiny
  // model on a small repetitive corpus can trip its alarms.
  auto r = run_keel("train" + kQuickRun + source + sets +
                    " --set run.max_steps=30 --set stability.enabled=false --run-dir " + run);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return run;
}

CommandResult export_hf(const std::string& checkpoint, const std::string& out) {
  return run_keel("export " + checkpoint + " --format hf --out " + out);
}

// keel's own logits for `ids`: the checkpoint's model (config.yaml, model.safetensors) in this
// process, as JSON {"ids", "logits"} (the form `keel sample --dump-logits` writes).
json keel_logits(const fs::path& checkpoint, const std::vector<int64_t>& ids) {
  const auto loaded = config::load_config_from_string(
      checkpoint::read_file(checkpoint / "config.yaml"), "config.yaml");
  model::Transformer net(loaded.config.model);
  const auto weights = checkpoint::read_safetensors(checkpoint / "model.safetensors").tensors;
  torch::NoGradGuard no_grad;
  for (auto& p : net->named_parameters()) p.value().copy_(weights.at(p.key()));
  net->eval();
  const auto logits = net->forward(torch::tensor(ids).view({1, -1}))[0].contiguous();  // (T, V)
  json out = {{"ids", ids}, {"logits", json::array()}};
  for (int64_t t = 0; t < logits.size(0); ++t) {
    const float* row = logits[t].data_ptr<float>();
    out["logits"].push_back(std::vector<float>(row, row + logits.size(1)));
  }
  return out;
}

std::vector<int64_t> encode(const std::string& data, const std::string& text) {
  const auto meta = json::parse(checkpoint::read_file(fs::path(data) / "meta.json"));
  const auto tok = data::tokenizer_from_meta(meta["tokenizer"], data);
  std::vector<uint32_t> ids;
  tok->encode(text, ids);
  return {ids.begin(), ids.end()};
}

// hf_check.py's verdict on `logits` (a JSON file) for the exported `dir`: its max_abs_diff.
double hf_max_abs_diff(const std::string& python, const std::string& dir, const std::string& logits,
                       const std::string& prompt) {
  const std::string cmd = python + " " + source_path("tests/tools/hf_check.py") + " " + dir +
                          " --logits " + logits +
                          (prompt.empty() ? "" : " --prompt '" + prompt + "'") + " 2>&1";
  auto r = run_shell(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  const auto line = r.output.rfind("{\"max_abs_diff\"");
  if (line == std::string::npos) return 1e9;
  return json::parse(r.output.substr(line, r.output.find('\n', line) - line))["max_abs_diff"];
}

struct Flavour {
  const char* name;
  const char* sets;          // --set overrides on top of kQuickRun
  const char* architecture;  // in the export's config.json
  bool text = true;          // trained on prepared byte-level text (else the synthetic chain)
};

class HfExportFlavour : public ::testing::TestWithParam<Flavour> {};

// Export, then transformers' logits for a prompt (or random ids) against keel's.
TEST_P(HfExportFlavour, TransformersComputesKeelsLogits) {
  const Flavour& f = GetParam();
  const std::string python = hf_python();
  ASSERT_FALSE(python.empty());
  ScratchDir dir(std::string("hf_logits_") + f.name);
  const std::string data = f.text ? prepare(dir, "byte") : "";
  const std::string run = train(dir, "run", data, f.sets);
  const std::string out = dir / "hf";
  auto r = export_hf(run, out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto config = json::parse(checkpoint::read_file(fs::path(out) / "config.json"));
  EXPECT_EQ(config["architectures"][0], f.architecture);
  EXPECT_EQ(fs::exists(fs::path(out) / "tokenizer.json"), f.text) << r.output;
  if (!f.text) EXPECT_NE(r.output.find("no tokenizer files"), std::string::npos) << r.output;

  std::vector<int64_t> ids;
  if (f.text) {
    ids = encode(data, kLongPrompt);
  } else {
    for (int64_t i = 0; i < 32; ++i) ids.push_back((i * 37 + 5) % 256);
  }
  const std::string logits = dir / "keel_logits.json";
  std::ofstream(logits) << keel_logits(fs::path(run) / "checkpoints/step_00000030", ids).dump();
  const double diff = hf_max_abs_diff(python, out, logits, f.text ? kLongPrompt : "");
  EXPECT_LE(diff, kLogitsTolerance) << f.name;
  std::cout << "[ hf       ] " << f.name << ": max |logits difference| " << diff << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Flavours, HfExportFlavour,
    ::testing::Values(Flavour{"llama_gqa_untied",
                              " --set model.qk_norm=false --set model.n_kv_heads=2"
                              " --set model.tie_embeddings=false",
                              "LlamaForCausalLM"},
                      Flavour{"llama_gqa_tied", " --set model.qk_norm=off --set model.n_kv_heads=1",
                              "LlamaForCausalLM"},
                      Flavour{"llama_qk_norm", " --set model.qk_norm=true --set model.n_kv_heads=2",
                              "Qwen3ForCausalLM"},
                      Flavour{"gpt2_tied", " --set model.arch=gpt2", "GPT2LMHeadModel"},
                      Flavour{"gpt2_untied",
                              " --set model.arch=gpt2 --set model.tie_embeddings=false",
                              "GPT2LMHeadModel"},
                      // keel's default llama (kQuickRun turns model.qk_norm off; auto is on).
                      Flavour{"llama_synthetic", " --set model.qk_norm=auto", "Qwen3ForCausalLM",
                              /*text=*/false}),
    [](const ::testing::TestParamInfo<Flavour>& info) { return std::string(info.param.name); });

// A SentencePiece dataset: transformers' tokenizer encodes the prompt to keel's ids, and the
// logits agree.
TEST(HfExport, SentencePieceTokenizerEncodesAsKeel) {
  const std::string python = hf_python();
  ASSERT_FALSE(python.empty());
  ScratchDir dir("hf_spm");
  const std::string data = prepare(dir, "spm-train:300");
  const std::string run = train(dir, "run", data, "");
  const std::string out = dir / "hf";
  auto r = export_hf(run, out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* file : {"tokenizer.model", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(fs::path(out) / file)) << file;
  const std::string prompt = kLongPrompt + " the fence";
  const std::string logits = dir / "keel_logits.json";
  std::ofstream(logits)
      << keel_logits(fs::path(run) / "checkpoints/step_00000030", encode(data, prompt)).dump();
  EXPECT_LE(hf_max_abs_diff(python, out, logits, prompt), kLogitsTolerance);
}

// export -> train --init-from (its step-0 checkpoint) -> export: the same bytes, for both archs.
// The init-from run leaves model.qk_norm auto, so the LlamaForCausalLM's model_type must turn it
// off (else config.json would not match).
TEST(HfExport, InitFromThenExportIsBitIdentical) {
  ScratchDir dir("hf_roundtrip");
  const std::string llama = " --set model.n_kv_heads=2 --set model.tie_embeddings=false";
  const std::string gpt2 = " --set model.arch=gpt2 --set model.tie_embeddings=false";
  const std::string auto_qk = " --set model.qk_norm=auto";  // after kQuickRun's off
  for (const auto& [trained, sets] : std::vector<std::pair<std::string, std::string>>{
           {llama + " --set model.qk_norm=off", llama + auto_qk}, {gpt2, gpt2 + auto_qk}}) {
    SCOPED_TRACE(trained);
    std::error_code ec;
    for (const char* leftover : {"run", "run2", "hf", "hf2"})
      checkpoint::remove_tree(dir / leftover, ec);
    const std::string run = train(dir, "run", "", trained);
    ASSERT_EQ(export_hf(run, dir / "hf").exit_code, 0);
    auto r = run_keel("train" + kQuickRun + sets +
                      " --set run.max_steps=2 --set schedule.warmup_steps=1 --init-from " +
                      (dir / "hf") + " --run-dir " + (dir / "run2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("--init-from"), std::string::npos) << r.output;
    if (sets == llama + auto_qk)
      EXPECT_NE(r.output.find("model.qk_norm: off from"), std::string::npos) << r.output;
    r = export_hf(dir / "run2/checkpoints/step_00000000", dir / "hf2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* file : {"model.safetensors", "config.json", "generation_config.json"})
      EXPECT_EQ(checkpoint::read_file(fs::path(dir / "hf") / file),
                checkpoint::read_file(fs::path(dir / "hf2") / file))
          << file;
  }
}

// A Hugging Face directory of another shape: exit 2 before anything starts, naming each key.
TEST(HfExport, InitFromAnotherShapeExits2NamingTheKeys) {
  ScratchDir dir("hf_mismatch");
  const std::string run = train(dir, "run", "", "");
  ASSERT_EQ(export_hf(run, dir / "hf").exit_code, 0);
  auto r = run_keel("train" + kQuickRun + " --set model.d_model=32 --set model.n_layers=3" +
                    " --init-from " + (dir / "hf") + " --run-dir " + (dir / "run2"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("hidden_size 64 in " + (dir / "hf") +
                          "/config.json, model.d_model 32 in the config"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("num_hidden_layers 2 in"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(fs::path(dir / "run2") / "checkpoints"));
  r = run_keel("train" + kQuickRun + " --init-from " + (dir / "absent") + " --run-dir " +
               (dir / "run3"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // A keel run directory where the export belongs: named, with the export that makes one.
  r = run_keel("train" + kQuickRun + " --init-from " + run + " --run-dir " + (dir / "run4"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("a keel run directory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("keel export " + run + " --format hf --out DIR"), std::string::npos)
      << r.output;
}

// Wrong input to export: exit 2 and a message naming it; nothing half-written is left behind.
TEST(HfExport, RefusalsExit2) {
  ScratchDir dir("hf_refusals");
  const std::string run = train(dir, "run", "", " --set model.arch=gpt2 --set model.qk_norm=true");
  auto r = run_keel("export " + run + " --format gguf --out " + (dir / "a"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = export_hf(dir / "absent", dir / "a");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = export_hf(run, dir / "a");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.qk_norm"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(fs::path(dir / "a")));

  const std::string llama = train(dir, "llama", "", "");
  ASSERT_EQ(export_hf(llama, dir / "b").exit_code, 0);
  r = export_hf(llama, dir / "b");  // not empty
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const fs::path weights = fs::path(llama) / "checkpoints/step_00000030/model.safetensors";
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(weights) - 3));
    f.put('\x7f');
  }
  r = export_hf(fs::path(llama) / "checkpoints/step_00000030", dir / "c");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("MANIFEST.json"), std::string::npos) << r.output;
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// `keel sample` (greedy) and transformers' greedy generate write the same text, and its
// --dump-logits agrees with transformers.
TEST(HfExport, SampleGreedyTextEqualsTransformers) {
  const std::string python = hf_python();
  ASSERT_FALSE(python.empty());
  ScratchDir dir("hf_sample");
  const std::string data = prepare(dir, "byte");
  const std::string run = train(dir, "run", data, " --set model.n_kv_heads=2");
  const std::string checkpoint = fs::path(run) / "checkpoints/step_00000030";
  ASSERT_EQ(export_hf(run, dir / "hf").exit_code, 0);
  constexpr int kTokens = 12;  // prompt (19 bytes) + 12 stays within model.seq_len 32

  auto r = run_keel("sample " + checkpoint + " --prompt '" + kPrompt + "' --tokens 0" +
                    " --dump-logits " + (dir / "sample_logits.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LE(hf_max_abs_diff(python, dir / "hf", dir / "sample_logits.json", kPrompt),
            kLogitsTolerance);

  r = run_keel("sample " + checkpoint + " --prompt '" + kPrompt + "' --tokens " +
               std::to_string(kTokens) + " --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto hf =
      run_shell(python + " " + source_path("tests/tools/hf_check.py") + " " + (dir / "hf") +
                " --greedy '" + kPrompt + "' " + std::to_string(kTokens) + " --json 2>/dev/null");
  ASSERT_EQ(hf.exit_code, 0) << hf.output;
  const auto greedy = json::parse(hf.output.substr(hf.output.rfind("{\"prompt_ids\"")));
  ASSERT_EQ(greedy["ids"].size(), static_cast<size_t>(kTokens));
  const std::string continuation = greedy["continuation"];
  EXPECT_NE(r.output.find(kPrompt + continuation), std::string::npos)
      << "transformers: " << kPrompt << continuation << "\nkeel sample:\n"
      << r.output;
}

}  // namespace
}  // namespace keel::testing
