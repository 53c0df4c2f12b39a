// keel <-> Hugging Face tensor layouts and config.json: every model flavour's parameters map to
// transformers' names and back bit-exactly, the fused tensors split where transformers expects,
// and config.json disagreements are named. (tests/integration/hf_test.cpp runs transformers.)
#include "checkpoint/hf_format.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "checkpoint/tensor_file.h"
#include "common/error.h"
#include "model/transformer.h"
#include "scratch_dir.h"

namespace keel::checkpoint {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

config::ModelConfig small(config::Arch arch) {
  config::ModelConfig m;
  m.arch = arch;
  m.vocab_size = 40;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.seq_len = 16;
  return m;
}

// The named parameters of a freshly initialised keel model.
TensorMap keel_weights(const config::ModelConfig& m) {
  torch::manual_seed(3);
  model::Transformer net(m);
  TensorMap out;
  for (const auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

struct Flavour {
  const char* name;
  config::ModelConfig model;
  const char* architecture;
};

std::vector<Flavour> flavours() {
  auto llama_default = small(config::Arch::kLlama);  // model.qk_norm auto: on for llama
  auto llama = llama_default;
  llama.qk_norm = config::Switch::kOff;  // plain Llama
  auto gqa_untied = llama;
  gqa_untied.n_kv_heads = 2;
  gqa_untied.tie_embeddings = false;
  auto qk = llama;
  qk.qk_norm = config::Switch::kOn;
  qk.n_kv_heads = 1;
  qk.d_ff = 48;
  auto gpt2 = small(config::Arch::kGpt2);
  auto gpt2_untied = gpt2;
  gpt2_untied.tie_embeddings = false;
  return {{"llama", llama, "LlamaForCausalLM"},
          {"llama_gqa_untied", gqa_untied, "LlamaForCausalLM"},
          {"llama_qk_norm", qk, "Qwen3ForCausalLM"},
          {"llama_default", llama_default, "Qwen3ForCausalLM"},
          {"gpt2", gpt2, "GPT2LMHeadModel"},
          {"gpt2_untied", gpt2_untied, "GPT2LMHeadModel"}};
}

TEST(HfFormat, EveryFlavourRoundTripsBitExactly) {
  for (const auto& f : flavours()) {
    SCOPED_TRACE(f.name);
    EXPECT_EQ(hf_architecture(f.model), f.architecture);
    const auto keel = keel_weights(f.model);
    const auto hf = to_hf_tensors(keel, f.model, "test");
    EXPECT_EQ(hf.count("lm_head.weight"), f.model.tie_embeddings ? 0u : 1u);
    for (const auto& [name, t] : hf) {
      EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
      EXPECT_TRUE(t.is_contiguous()) << name;
    }
    const auto back = from_hf_tensors(hf, f.model, "test");
    ASSERT_EQ(back.size(), keel.size());
    for (const auto& [name, t] : keel) {
      ASSERT_TRUE(back.count(name)) << name;
      EXPECT_TRUE(torch::equal(back.at(name), t)) << name;
    }
  }
}

TEST(HfFormat, LlamaSplitsQkvAndGateUpByRows) {
  auto m = small(config::Arch::kLlama);
  m.n_kv_heads = 2;
  const int64_t D = 8, F = config::effective_d_ff(m);
  const auto keel = keel_weights(m);
  const auto hf = to_hf_tensors(keel, m, "test");
  const auto& qkv = keel.at("layers.1.attn.qkv.weight");  // ((4 + 2*2) * 8, 32)
  EXPECT_TRUE(torch::equal(hf.at("model.layers.1.self_attn.q_proj.weight"), qkv.slice(0, 0, 32)));
  EXPECT_TRUE(
      torch::equal(hf.at("model.layers.1.self_attn.k_proj.weight"), qkv.slice(0, 32, 32 + 2 * D)));
  EXPECT_TRUE(torch::equal(hf.at("model.layers.1.self_attn.v_proj.weight"),
                           qkv.slice(0, 32 + 2 * D, 32 + 4 * D)));
  // fused_ops' swiglu is silu(first half) * second half: gate first.
  const auto& fc = keel.at("layers.0.mlp.fc.weight");
  EXPECT_TRUE(torch::equal(hf.at("model.layers.0.mlp.gate_proj.weight"), fc.slice(0, 0, F)));
  EXPECT_TRUE(torch::equal(hf.at("model.layers.0.mlp.up_proj.weight"), fc.slice(0, F, 2 * F)));
  EXPECT_TRUE(torch::equal(hf.at("model.norm.weight"), keel.at("final_norm.weight")));
}

TEST(HfFormat, Gpt2StoresConv1dWeightsTransposed) {
  const auto m = small(config::Arch::kGpt2);
  const auto keel = keel_weights(m);
  const auto hf = to_hf_tensors(keel, m, "test");
  EXPECT_TRUE(torch::equal(hf.at("transformer.h.0.attn.c_attn.weight"),
                           keel.at("layers.0.attn.qkv.weight").t()));
  EXPECT_TRUE(
      torch::equal(hf.at("transformer.h.0.attn.c_attn.bias"), keel.at("layers.0.attn.qkv.bias")));
  EXPECT_EQ(hf.at("transformer.h.1.mlp.c_fc.weight").sizes(), (std::vector<int64_t>{32, 128}));
  EXPECT_TRUE(torch::equal(hf.at("transformer.wpe.weight"), keel.at("pos_emb.weight")));
}

TEST(HfFormat, ReadsGpt2WithoutPrefixAndIgnoresBuffers) {
  const auto m = small(config::Arch::kGpt2);
  const auto keel = keel_weights(m);
  TensorMap bare;
  for (const auto& [name, t] : to_hf_tensors(keel, m, "test"))
    bare[name.substr(std::string("transformer.").size())] = t;
  bare["h.0.attn.bias"] = torch::ones({1, 1, 16, 16});  // transformers 4.x's causal-mask buffer
  const auto back = from_hf_tensors(bare, m, "test");
  EXPECT_TRUE(torch::equal(back.at("tok_emb.weight"), keel.at("tok_emb.weight")));
}

TEST(HfFormat, RefusesUnknownMissingAndMisshapenTensors) {
  const auto m = small(config::Arch::kLlama);
  auto hf = to_hf_tensors(keel_weights(m), m, "test");
  auto extra = hf;
  extra["model.layers.0.self_attn.q_proj.bias"] = torch::zeros({32});
  EXPECT_THROW(from_hf_tensors(extra, m, "test"), CheckpointError);
  auto missing = hf;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  EXPECT_THROW(from_hf_tensors(missing, m, "test"), CheckpointError);
  auto wrong = hf;
  wrong["model.norm.weight"] = torch::ones({31});
  EXPECT_THROW(from_hf_tensors(wrong, m, "test"), CheckpointError);
  auto keel = keel_weights(m);
  keel["layers.9.attn.proj.weight"] = torch::zeros({32, 32});
  EXPECT_THROW(to_hf_tensors(keel, m, "test"), CheckpointError);
}

TEST(HfFormat, RefusesWhatGpt2CannotHold) {
  auto qk = small(config::Arch::kGpt2);
  qk.qk_norm = config::Switch::kOn;
  try {
    hf_architecture(qk);
    FAIL() << "gpt2 with qk_norm exported";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.qk_norm"), std::string::npos) << e.what();
  }
  auto gqa = small(config::Arch::kGpt2);
  gqa.n_kv_heads = 2;
  try {
    hf_architecture(gqa);
    FAIL() << "gpt2 with grouped kv heads exported";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_heads"), std::string::npos) << e.what();
  }
}

TEST(HfFormat, ConfigAgreesWithItselfAndNamesEachMismatch) {
  for (const auto& f : flavours()) {
    SCOPED_TRACE(f.name);
    const auto j = hf_config(f.model, {256, 256});
    EXPECT_EQ(j["architectures"][0], f.architecture);
    EXPECT_TRUE(hf_config_mismatches(j, f.model, "c.json").empty());
  }
  const auto m = small(config::Arch::kLlama);
  auto other = m;
  other.d_model = 64;
  other.n_layers = 3;
  const auto problems = hf_config_mismatches(hf_config(other, {}), m, "DIR/config.json");
  std::string all;
  for (const auto& p : problems) all += p + "\n";
  EXPECT_NE(all.find("hidden_size 64 in DIR/config.json, model.d_model 32 in the config"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("num_hidden_layers 3 in DIR/config.json, model.n_layers 2 in the config"),
            std::string::npos)
      << all;
  auto j = hf_config(m, {});
  j["rope_parameters"]["rope_theta"] = 500000.0;
  j["rms_norm_eps"] = 1e-6;
  const auto numerics = hf_config_mismatches(j, m, "c.json");
  ASSERT_EQ(numerics.size(), 2u);
  // A gpt2 directory for a llama config: one line, about the type.
  EXPECT_EQ(hf_config_mismatches(hf_config(small(config::Arch::kGpt2), {}), m, "c.json").size(),
            1u);
}

// --init-from takes an auto model.qk_norm from config.json's model_type.
TEST(HfFormat, QkNormFollowsTheModelType) {
  for (const auto& f : flavours()) {
    SCOPED_TRACE(f.name);
    const auto j = hf_config(f.model, {});
    const auto want = config::qk_norm_on(f.model) ? config::Switch::kOn : config::Switch::kOff;
    EXPECT_EQ(hf_qk_norm(j).value_or(config::Switch::kAuto), want);
  }
  EXPECT_FALSE(hf_qk_norm(nlohmann::json{{"model_type", "mistral"}}).has_value());
  EXPECT_FALSE(hf_qk_norm(nlohmann::json::array()).has_value());
}

TEST(HfFormat, CheckHfConfigThrowsConfigErrorNamingTheKey) {
  keel::testing::ScratchDir d("hf_format_check");
  const auto m = small(config::Arch::kGpt2);
  auto other = m;
  other.n_heads = 8;
  std::ofstream(d / "config.json") << hf_config(other, {}).dump();
  try {
    check_hf_config(d.path(), m);
    FAIL() << "mismatch accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_head 8 in"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.n_heads 4 in the config"), std::string::npos);
  }
  EXPECT_THROW(check_hf_config(d / "absent", m), CheckpointError);
}

// The streamed paths give what the in-memory ones give: export written one HF tensor at a time
// from the rows it needs has the bytes of write_safetensors(to_hf_tensors(...)), and a model
// directory read one keel tensor at a time (here in bf16, as transformers often saves) gives
// from_hf_tensors' tensors; a tensor the model has no place for is refused before any is read.
TEST(HfFormat, StreamedExportAndReadMatchTheWholeConversions) {
  keel::testing::ScratchDir d("hf_format_streamed");
  for (const auto& f : flavours()) {
    SCOPED_TRACE(f.name);
    const auto keel = keel_weights(f.model);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [name, t] : keel) shapes[name] = t.sizes().vec();
    std::map<std::string, int64_t> rows_read;
    const KeelRows rows = [&](const std::string& name, int64_t first, int64_t n) {
      rows_read[name] += n;
      return keel.at(name).narrow(0, first, n).clone();
    };
    const fs::path dir = d / f.name;
    fs::create_directories(dir);
    write_hf_weights(dir / "model.safetensors", f.model, shapes, rows, "test");
    const std::string streamed = read_text(dir / "model.safetensors");
    EXPECT_EQ(streamed,
              encode_safetensors(to_hf_tensors(keel, f.model, "test"), {{"format", "pt"}}));
    for (const auto& [name, t] : keel) EXPECT_EQ(rows_read[name], t.size(0)) << name;

    std::ofstream(dir / "config.json") << hf_config(f.model, {}).dump();
    const HfModelReader reader(dir, f.model);
    const auto whole = from_hf_tensors(to_hf_tensors(keel, f.model, "test"), f.model, "test");
    ASSERT_EQ(reader.names().size(), whole.size());
    for (const auto& name : reader.names())
      EXPECT_TRUE(torch::equal(reader.read(name), whole.at(name)));

    TensorMap bf16;
    for (auto& [name, t] : to_hf_tensors(keel, f.model, "test"))
      bf16[name] = t.to(torch::kBFloat16);
    bf16["model.extra.weight"] = torch::zeros({2});
    const fs::path other = d / (std::string(f.name) + "_bf16");
    fs::create_directories(other);
    std::ofstream(other / "config.json") << hf_config(f.model, {}).dump();
    write_safetensors(other / "model.safetensors", bf16);
    EXPECT_THROW(HfModelReader(other, f.model), CheckpointError);
    fs::remove(other / "model.safetensors");
    bf16.erase("model.extra.weight");
    write_safetensors(other / "model.safetensors", bf16);
    const HfModelReader low(other, f.model);
    for (const auto& name : low.names())
      EXPECT_TRUE(
          torch::equal(low.read(name), whole.at(name).to(torch::kBFloat16).to(torch::kFloat)))
          << name;
  }
}

}  // namespace
}  // namespace keel::checkpoint
