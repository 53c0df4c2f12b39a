#include "checkpoint/hf_format.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <c10/util/accumulate.h>

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "common/error.h"
#include "common/paths.h"

namespace keel::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_gpt2(const config::ModelConfig& m) { return m.arch == config::Arch::kGpt2; }

// One HF tensor holding rows [offset, offset + rows) of a keel tensor.
struct Part {
  std::string name;
  int64_t offset = 0, rows = 0;
};

// A keel tensor and the HF tensors it is stored as.
struct Mapping {
  std::string keel;
  std::vector<int64_t> shape;  // keel's
  std::vector<Part> parts;     // along dim 0, in order, covering it
  bool transposed = false;     // GPT-2's Conv1D: each (2-D) part is stored (in, out)
};

std::vector<Mapping> mappings(const config::ModelConfig& m) {
  const int64_t C = m.d_model, H = m.n_heads, Hkv = config::effective_kv_heads(m), D = C / H;
  const int64_t F = config::effective_d_ff(m), V = m.vocab_size, T = m.seq_len;
  std::vector<Mapping> out;
  auto one = [&out](std::string keel, std::vector<int64_t> shape, std::string hf,
                    bool conv1d = false) {
    const bool transposed = conv1d && shape.size() == 2;
    const int64_t rows = shape[0];
    out.push_back({std::move(keel), std::move(shape), {{std::move(hf), 0, rows}}, transposed});
  };
  if (is_gpt2(m)) {
    one("tok_emb.weight", {V, C}, "transformer.wte.weight");
    one("pos_emb.weight", {T, C}, "transformer.wpe.weight");
    for (int64_t i = 0; i < m.n_layers; ++i) {
      const std::string k = fmt::format("layers.{}.", i), h = fmt::format("transformer.h.{}.", i);
      for (const char* p : {"weight", "bias"}) {
        const std::string s = p;
        const bool w = s == "weight";
        one(k + "attn_norm." + s, {C}, h + "ln_1." + s);
        one(k + "attn.qkv." + s, w ? std::vector<int64_t>{3 * C, C} : std::vector<int64_t>{3 * C},
            h + "attn.c_attn." + s, true);
        one(k + "attn.proj." + s, w ? std::vector<int64_t>{C, C} : std::vector<int64_t>{C},
            h + "attn.c_proj." + s, true);
        one(k + "mlp_norm." + s, {C}, h + "ln_2." + s);
        one(k + "mlp.fc." + s, w ? std::vector<int64_t>{F, C} : std::vector<int64_t>{F},
            h + "mlp.c_fc." + s, true);
        one(k + "mlp.proj." + s, w ? std::vector<int64_t>{C, F} : std::vector<int64_t>{C},
            h + "mlp.c_proj." + s, true);
      }
    }
    one("final_norm.weight", {C}, "transformer.ln_f.weight");
    one("final_norm.bias", {C}, "transformer.ln_f.bias");
  } else {
    one("tok_emb.weight", {V, C}, "model.embed_tokens.weight");
    for (int64_t i = 0; i < m.n_layers; ++i) {
      const std::string k = fmt::format("layers.{}.", i), h = fmt::format("model.layers.{}.", i);
      one(k + "attn_norm.weight", {C}, h + "input_layernorm.weight");
      out.push_back({k + "attn.qkv.weight",
                     {(H + 2 * Hkv) * D, C},
                     {{h + "self_attn.q_proj.weight", 0, H * D},
                      {h + "self_attn.k_proj.weight", H * D, Hkv * D},
                      {h + "self_attn.v_proj.weight", (H + Hkv) * D, Hkv * D}}});
      if (config::qk_norm_on(m)) {
        one(k + "attn.q_norm.weight", {D}, h + "self_attn.q_norm.weight");
        one(k + "attn.k_norm.weight", {D}, h + "self_attn.k_norm.weight");
      }
      one(k + "attn.proj.weight", {C, C}, h + "self_attn.o_proj.weight");
      one(k + "mlp_norm.weight", {C}, h + "post_attention_layernorm.weight");
      // fused_ops.cpp swiglu: silu(first half) * second half, so gate rows come first.
      out.push_back({k + "mlp.fc.weight",
                     {2 * F, C},
                     {{h + "mlp.gate_proj.weight", 0, F}, {h + "mlp.up_proj.weight", F, F}}});
      one(k + "mlp.proj.weight", {C, F}, h + "mlp.down_proj.weight");
    }
    one("final_norm.weight", {C}, "model.norm.weight");
  }
  if (!m.tie_embeddings) one("lm_head.weight", {V, C}, "lm_head.weight");
  return out;
}

std::string shape_str(c10::IntArrayRef s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The shape an HF part of `map` has.
std::vector<int64_t> part_shape(const Mapping& map, const Part& part) {
  std::vector<int64_t> s = map.shape;
  s[0] = part.rows;
  if (map.transposed) std::swap(s[0], s[1]);
  return s;
}

// Buffers and duplicates transformers writes or reads past without complaint.
bool ignorable_hf_tensor(const std::string& name, const config::ModelConfig& m) {
  auto ends_with = [&name](std::string_view s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") ||
         ends_with("rotary_emb.inv_freq") || (m.tie_embeddings && name == "lm_head.weight");
}

std::string json_value(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string fmt_double(double v) { return fmt::format("{}", v); }

// Collects the disagreements between config.json and what keel computes.
class Checker {
 public:
  Checker(const json& hf, std::string file) : hf_(hf), file_(std::move(file)) {}

  // `key` of config.json must equal `want`; `absent` is what transformers assumes when the file
  // omits it (null: the key is required); `keel_side` says where keel's value comes from.
  void expect(const std::string& key, const json& want, const std::string& keel_side,
              const json& absent = nullptr) {
    const bool has = hf_.contains(key);
    if (!has && absent.is_null()) {
      problems_.push_back(fmt::format("{} missing from {}, {}", key, file_, keel_side));
      return;
    }
    check(key, has ? hf_[key] : absent, want, keel_side);
  }
  // A value found elsewhere than at a top-level key (rope_parameters.rope_theta).
  void check(const std::string& key, const json& got, const json& want,
             const std::string& keel_side) {
    if (got != want)
      problems_.push_back(fmt::format("{} {} in {}, {}", key, json_value(got), file_, keel_side));
  }
  std::vector<std::string> take() { return std::move(problems_); }

 private:
  const json& hf_;
  std::string file_;
  std::vector<std::string> problems_;
};

std::string in_config(const std::string& key, int64_t v) {
  return fmt::format("{} {} in the config", key, v);
}

json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError(path.string() + ": cannot be read (missing?)");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw CheckpointError(path.string() + ": not valid JSON (" + e.what() + ")");
  }
}

// An HF file's tensors: shape and dtype by name, without their data.
struct HfTensorInfo {
  std::vector<int64_t> shape;
  torch::ScalarType dtype;
};
using HfTensors = std::map<std::string, HfTensorInfo>;

// transformers' name of each HF tensor -> the name it has in `found`: openai-community/gpt2 and
// other early files name GPT-2's tensors without "transformer.".
std::map<std::string, std::string> hf_names(const HfTensors& found, const config::ModelConfig& m) {
  const bool bare =
      is_gpt2(m) && !found.count("transformer.wte.weight") && found.count("wte.weight");
  std::map<std::string, std::string> out;
  for (const auto& [name, info] : found)
    out[bare && name != "lm_head.weight" ? "transformer." + name : name] = name;
  return out;
}

// Every HF tensor keel's model needs is in `found` with its shape and a floating dtype, and
// nothing is there that the model has no place for; CheckpointError naming `source` otherwise.
void check_hf_tensors(const HfTensors& found, const std::map<std::string, std::string>& names,
                      const config::ModelConfig& m, const std::string& source) {
  std::set<std::string> used;
  for (const auto& map : mappings(m)) {
    for (const auto& part : map.parts) {
      auto it = names.find(part.name);
      if (it == names.end())
        throw CheckpointError(
            fmt::format("{}: no tensor {} (keel's {})", source, part.name, map.keel));
      const HfTensorInfo& info = found.at(it->second);
      const auto want = part_shape(map, part);
      if (info.shape != want)
        throw CheckpointError(fmt::format("{}: {} has shape {}, keel's model needs {}", source,
                                          part.name, shape_str(info.shape), shape_str(want)));
      if (!c10::isFloatingType(info.dtype))
        throw CheckpointError(
            fmt::format("{}: {} is not a floating-point tensor", source, part.name));
      used.insert(part.name);
    }
  }
  std::vector<std::string> unknown;
  for (const auto& [name, stored] : names)
    if (!used.count(name) && !ignorable_hf_tensor(name, m)) unknown.push_back(stored);
  if (!unknown.empty()) {
    const size_t shown = std::min<size_t>(unknown.size(), 5);
    throw CheckpointError(fmt::format(
        "{}: {} tensor(s) keel's model has no place for: {}{}; HINT: config.json and the weights "
        "disagree, or the model has parts keel does not implement",
        source, unknown.size(),
        fmt::join(unknown.begin(), unknown.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
        unknown.size() > shown ? ", ..." : ""));
  }
}

// keel's tensor `map` (fp32, CPU, contiguous) from its HF parts, which `fetch` reads by
// transformers' name (checked already: check_hf_tensors).
torch::Tensor assemble(const Mapping& map,
                       const std::function<torch::Tensor(const std::string&)>& fetch) {
  std::vector<torch::Tensor> pieces;
  for (const auto& part : map.parts) {
    auto p = fetch(part.name).to(torch::kCPU, torch::kFloat);
    pieces.push_back(map.transposed ? p.t() : p);
  }
  return pieces.size() == 1 ? pieces[0].contiguous() : torch::cat(pieces, 0);
}

}  // namespace

std::string hf_architecture(const config::ModelConfig& m) {
  if (!is_gpt2(m)) return config::qk_norm_on(m) ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  if (config::qk_norm_on(m))
    throw ConfigError(
        "model.qk_norm: on has no GPT-2 equivalent in transformers (GPT2LMHeadModel has no "
        "q/k norms); HINT: arch llama with qk_norm exports as Qwen3ForCausalLM");
  if (config::effective_kv_heads(m) != m.n_heads)
    throw ConfigError(fmt::format(
        "model.n_kv_heads: {} with model.n_heads {} has no GPT-2 equivalent in transformers "
        "(GPT2LMHeadModel has no grouped-query attention); HINT: arch llama exports grouped "
        "heads as LlamaForCausalLM",
        m.n_kv_heads, m.n_heads));
  return "GPT2LMHeadModel";
}

json hf_config(const config::ModelConfig& m, const HfTokenIds& tokens) {
  const std::string arch = hf_architecture(m);
  const json bos = tokens.bos ? json(*tokens.bos) : json(nullptr);
  const json eos = tokens.eos ? json(*tokens.eos) : json(nullptr);
  const int64_t F = config::effective_d_ff(m);
  if (is_gpt2(m)) {
    return {{"architectures", {arch}},
            {"model_type", "gpt2"},
            {"vocab_size", m.vocab_size},
            {"n_positions", m.seq_len},
            {"n_ctx", m.seq_len},
            {"n_embd", m.d_model},
            {"n_layer", m.n_layers},
            {"n_head", m.n_heads},
            {"n_inner", F},
            {"activation_function", "gelu_new"},  // the tanh approximation keel's MLP uses
            {"layer_norm_epsilon", kHfNormEps},
            {"resid_pdrop", m.dropout},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", m.dropout},
            {"initializer_range", m.init_std},
            {"scale_attn_weights", true},
            {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false},
            {"tie_word_embeddings", m.tie_embeddings},
            {"bos_token_id", bos},
            {"eos_token_id", eos},
            {"use_cache", true},
            {"dtype", "float32"}};
  }
  const bool qwen3 = config::qk_norm_on(m);
  json j = {{"architectures", {arch}},
            {"model_type", qwen3 ? "qwen3" : "llama"},
            {"vocab_size", m.vocab_size},
            {"hidden_size", m.d_model},
            {"intermediate_size", F},
            {"num_hidden_layers", m.n_layers},
            {"num_attention_heads", m.n_heads},
            {"num_key_value_heads", config::effective_kv_heads(m)},
            {"head_dim", m.d_model / m.n_heads},
            {"hidden_act", "silu"},
            {"max_position_embeddings", m.seq_len},
            {"rms_norm_eps", kHfNormEps},
            {"rope_theta", kHfRopeTheta},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", kHfRopeTheta}}},
            {"attention_bias", false},
            {"attention_dropout", m.dropout},
            {"initializer_range", m.init_std},
            {"tie_word_embeddings", m.tie_embeddings},
            {"bos_token_id", bos},
            {"eos_token_id", eos},
            {"use_cache", true},
            {"dtype", "float32"}};
  if (qwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = m.n_layers;
    j["layer_types"] = std::vector<std::string>(m.n_layers, "full_attention");
  } else {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  return j;
}

json hf_generation_config(const HfTokenIds& tokens) {
  json j = {{"do_sample", false}};
  if (tokens.bos) j["bos_token_id"] = *tokens.bos;
  if (tokens.eos) j["eos_token_id"] = *tokens.eos;
  return j;
}

namespace {

// keel's tensors (`shapes`) are those of the model `m`: each there with its shape, nothing else
// but the rotary tables. CheckpointError naming `source` otherwise.
void check_keel_tensors(const std::map<std::string, std::vector<int64_t>>& shapes,
                        const config::ModelConfig& m, const std::string& source) {
  std::set<std::string> used;
  for (const auto& map : mappings(m)) {
    auto it = shapes.find(map.keel);
    if (it == shapes.end())
      throw CheckpointError(
          fmt::format("{}: no tensor {}, which the config's model has", source, map.keel));
    if (it->second != map.shape)
      throw CheckpointError(fmt::format("{}: {} has shape {}, the config's model {}", source,
                                        map.keel, shape_str(it->second), shape_str(map.shape)));
    used.insert(map.keel);
  }
  for (const auto& [name, shape] : shapes) {
    if (used.count(name) || name == "rope_cos" || name == "rope_sin") continue;
    throw CheckpointError(fmt::format(
        "{}: tensor {} is not part of the model the config describes (model section changed?)",
        source, name));
  }
}

// HF tensor `part` of `map` (fp32, CPU, contiguous) from the keel rows it holds.
torch::Tensor hf_part(const Mapping& map, const Part& part, const KeelRows& rows) {
  auto p = rows(map.keel, part.offset, part.rows).to(torch::kCPU, torch::kFloat);
  return (map.transposed ? p.t() : p).contiguous();
}

}  // namespace

TensorMap to_hf_tensors(const TensorMap& keel, const config::ModelConfig& m,
                        const std::string& source) {
  hf_architecture(m);  // refuses what transformers cannot represent
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, t] : keel) shapes[name] = t.sizes().vec();
  check_keel_tensors(shapes, m, source);
  const KeelRows rows = [&keel](const std::string& name, int64_t first, int64_t n) {
    return keel.at(name).narrow(0, first, n);
  };
  TensorMap out;
  for (const auto& map : mappings(m))
    for (const auto& part : map.parts) out[part.name] = hf_part(map, part, rows);
  return out;
}

FileDigest write_hf_weights(const fs::path& path, const config::ModelConfig& m,
                            const std::map<std::string, std::vector<int64_t>>& keel_shapes,
                            const KeelRows& rows, const std::string& source) {
  hf_architecture(m);
  check_keel_tensors(keel_shapes, m, source);
  std::map<std::string, std::pair<const Mapping*, const Part*>> by_hf_name;
  std::vector<TensorSpec> specs;
  const std::vector<Mapping> maps = mappings(m);
  for (const auto& map : maps) {
    for (const auto& part : map.parts) {
      by_hf_name[part.name] = {&map, &part};
      specs.push_back({part.name, torch::kFloat, part_shape(map, part)});
    }
  }
  return write_safetensors_streamed(path, specs,
                                    [&](const std::string& name) {
                                      const auto& [map, part] = by_hf_name.at(name);
                                      return hf_part(*map, *part, rows);
                                    },
                                    {{"format", "pt"}});
}

TensorMap from_hf_tensors(const TensorMap& hf, const config::ModelConfig& m,
                          const std::string& source) {
  HfTensors found;
  for (const auto& [name, t] : hf) found[name] = {t.sizes().vec(), t.scalar_type()};
  const auto names = hf_names(found, m);
  check_hf_tensors(found, names, m, source);
  TensorMap out;
  for (const auto& map : mappings(m))
    out[map.keel] = assemble(map, [&](const std::string& part) { return hf.at(names.at(part)); });
  return out;
}

std::vector<std::string> hf_config_mismatches(const json& hf, const config::ModelConfig& m,
                                              const std::string& file) {
  const std::string arch = config::name_of(m.arch).data();
  const std::string want_type = is_gpt2(m) ? "gpt2" : (config::qk_norm_on(m) ? "qwen3" : "llama");
  Checker c(hf, file);
  const std::string keel_arch =
      fmt::format("model.arch {}, model.qk_norm {} in the config (transformers model_type {})",
                  arch, config::name_of(m.qk_norm), want_type);
  c.expect("model_type", want_type, keel_arch);
  auto problems = c.take();
  if (!problems.empty()) return problems;  // the other keys would not mean the same

  const int64_t F = config::effective_d_ff(m);
  const std::string d_ff_side =
      m.d_ff > 0 ? in_config("model.d_ff", F)
                 : fmt::format("model.d_ff 0 in the config ({} derived from model.d_model {})", F,
                               m.d_model);
  c.expect("vocab_size", m.vocab_size, in_config("model.vocab_size", m.vocab_size));
  const std::string tie_side =
      fmt::format("model.tie_embeddings {} in the config", m.tie_embeddings);
  const std::string eps_side = fmt::format("keel's norms use eps {}", fmt_double(kHfNormEps));
  if (is_gpt2(m)) {
    c.expect("n_embd", m.d_model, in_config("model.d_model", m.d_model), 768);
    c.expect("n_layer", m.n_layers, in_config("model.n_layers", m.n_layers), 12);
    c.expect("n_head", m.n_heads, in_config("model.n_heads", m.n_heads), 12);
    c.expect("n_positions", m.seq_len, in_config("model.seq_len", m.seq_len), 1024);
    const json n_inner = hf.contains("n_inner") && !hf["n_inner"].is_null()
                             ? hf["n_inner"]
                             : json(4 * hf.value("n_embd", int64_t{768}));
    c.check("n_inner", n_inner, F, d_ff_side);
    const std::string act = hf.value("activation_function", std::string("gelu_new"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      c.check("activation_function", act, "gelu_new",
              "keel's gpt2 MLP uses GELU with the tanh approximation (gelu_new)");
    c.expect("layer_norm_epsilon", kHfNormEps, eps_side, 1e-5);
    c.expect("scale_attn_weights", true, "keel scales attention by 1/sqrt(head dim)", true);
    c.expect("scale_attn_by_inverse_layer_idx", false, "keel does not scale by layer", false);
    c.expect("add_cross_attention", false, "keel has no cross-attention", false);
    c.expect("tie_word_embeddings", m.tie_embeddings, tie_side, true);
    return c.take();
  }
  c.expect("hidden_size", m.d_model, in_config("model.d_model", m.d_model));
  c.expect("num_hidden_layers", m.n_layers, in_config("model.n_layers", m.n_layers));
  c.expect("num_attention_heads", m.n_heads, in_config("model.n_heads", m.n_heads));
  const int64_t kv = config::effective_kv_heads(m);
  c.expect("num_key_value_heads", kv,
           m.n_kv_heads > 0
               ? in_config("model.n_kv_heads", kv)
               : fmt::format("model.n_kv_heads 0 in the config (= model.n_heads {})", kv),
           hf.value("num_attention_heads", json(nullptr)));
  c.expect("intermediate_size", F, d_ff_side);
  if (hf.contains("head_dim") && !hf["head_dim"].is_null())
    c.check("head_dim", hf["head_dim"], m.d_model / m.n_heads,
            fmt::format("model.d_model / model.n_heads = {} in the config", m.d_model / m.n_heads));
  c.expect("hidden_act", "silu", "keel's llama MLP is SwiGLU (silu)", "silu");
  c.expect("rms_norm_eps", kHfNormEps, eps_side, 1e-6);
  // transformers 5 writes rope_parameters {rope_type, rope_theta}; 4.x rope_theta and
  // rope_scaling.
  json rope = hf.contains("rope_parameters") && hf["rope_parameters"].is_object()
                  ? hf["rope_parameters"]
                  : json::object();
  const json theta =
      rope.contains("rope_theta") ? rope["rope_theta"] : hf.value("rope_theta", json(kHfRopeTheta));
  c.check("rope_theta", theta, kHfRopeTheta,
          fmt::format("keel's rotary uses base {}", fmt_double(kHfRopeTheta)));
  json rope_type = rope.value("rope_type", json("default"));
  if (hf.contains("rope_scaling") && hf["rope_scaling"].is_object())
    rope_type =
        hf["rope_scaling"].value("rope_type", hf["rope_scaling"].value("type", json("default")));
  c.check("rope_type", rope_type, "default", "keel's rotary is unscaled (rope_type default)");
  c.expect("attention_bias", false, "keel's llama attention has no biases", false);
  if (want_type == "qwen3") {
    c.expect("use_sliding_window", false, "keel's attention is full causal", false);
  } else {
    c.expect("mlp_bias", false, "keel's llama MLP has no biases", false);
  }
  c.expect("tie_word_embeddings", m.tie_embeddings, tie_side, false);
  return c.take();
}

void check_hf_config(const fs::path& dir, const config::ModelConfig& m) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw CheckpointError(dir.string() + ": no such directory" + relative_note(dir) +
                          "; HINT: --init-from wants a Hugging Face model "
                          "directory (config.json and model.safetensors), as `keel export "
                          "--format hf` writes");
  const fs::path config_file = dir / "config.json";
  if (!fs::exists(config_file, ec)) {  // a keel run or checkpoint is the likeliest mistake
    const std::string what = fs::exists(dir / "trainer_state.json", ec) ? ": a keel checkpoint"
                             : fs::exists(dir / "checkpoints", ec)      ? ": a keel run directory"
                                                                        : "";
    throw CheckpointError(dir.string() + ": no config.json" + what +
                          "; HINT: --init-from wants a Hugging Face model directory (config.json "
                          "and model.safetensors): `keel export " +
                          (what.empty() ? "RUN_DIR" : dir.string()) +
                          " --format hf --out DIR` writes one; to continue this run, use --resume");
  }
  const json hf = read_json_file(config_file);
  if (!hf.is_object()) throw CheckpointError(config_file.string() + ": not a JSON object");
  std::vector<std::string> problems;
  try {
    problems = hf_config_mismatches(hf, m, config_file.string());
  } catch (const json::exception& e) {  // a key of the wrong JSON type
    throw CheckpointError(config_file.string() + ": " + e.what());
  }
  if (!problems.empty())
    throw ConfigError(fmt::format(
        "--init-from {}: the Hugging Face model does not match the model section:\n  {}\nHINT: "
        "set the model.* keys to the Hugging Face model's values (--set model.d_model=...), or "
        "pass a directory whose model matches",
        dir.string(), fmt::join(problems, "\n  ")));
}

// Where each tensor of a Hugging Face model directory is: its file and header entry.
struct HfModelReader::Index {
  struct Stored {
    fs::path file;
    std::shared_ptr<const SafetensorsHeader> header;  // holds `entry`
    const TensorEntry* entry = nullptr;
  };
  std::string source;
  std::vector<Mapping> maps;
  std::map<std::string, std::string> names;  // transformers' name -> the name in the file
  std::map<std::string, Stored> stored;      // by the name in the file
};

HfModelReader::HfModelReader(const fs::path& dir, const config::ModelConfig& m) {
  check_hf_config(dir, m);
  auto index = std::make_shared<Index>();
  index->source = dir.string();
  index->maps = mappings(m);
  std::error_code ec;
  std::set<std::string> files;
  const fs::path single = dir / "model.safetensors", listing = dir / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    files.insert(single.filename().string());
  } else if (fs::exists(listing, ec)) {
    const json idx = read_json_file(listing);
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      throw CheckpointError(listing.string() + ": no weight_map object");
    for (const auto& [name, file] : idx["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw CheckpointError(listing.string() + ": weight_map entry " + name +
                              " is not a file name");
      files.insert(file.get<std::string>());
    }
  } else {
    throw CheckpointError(dir.string() +
                          ": no model.safetensors (nor model.safetensors.index.json); HINT: keel "
                          "reads safetensors only: save with save_pretrained(DIR, "
                          "safe_serialization=True)");
  }
  HfTensors found;
  for (const auto& f : files) {
    auto header = std::make_shared<const SafetensorsHeader>(read_safetensors_header(dir / f));
    for (const auto& e : header->tensors) {
      found[e.name] = {e.shape, e.dtype};
      index->stored[e.name] = {dir / f, header, &e};
    }
  }
  index->names = hf_names(found, m);
  check_hf_tensors(found, index->names, m, index->source);
  index_ = std::move(index);
}

std::vector<std::string> HfModelReader::names() const {
  std::vector<std::string> out;
  for (const auto& map : index_->maps) out.push_back(map.keel);
  return out;
}

torch::Tensor HfModelReader::read(const std::string& keel_name) const {
  for (const auto& map : index_->maps) {
    if (map.keel != keel_name) continue;
    return assemble(map, [this](const std::string& hf) {
      const Index::Stored& s = index_->stored.at(index_->names.at(hf));
      return read_safetensors_elements(s.file, *s.header, *s.entry, 0,
                                       c10::multiply_integers(s.entry->shape))
          .view(s.entry->shape);
    });
  }
  throw CheckpointError(index_->source + ": keel's model has no tensor " + keel_name);
}

TensorMap read_hf_model(const fs::path& dir, const config::ModelConfig& m) {
  const HfModelReader reader(dir, m);
  TensorMap out;
  for (const auto& name : reader.names()) out[name] = reader.read(name);
  return out;
}

}  // namespace keel::checkpoint
