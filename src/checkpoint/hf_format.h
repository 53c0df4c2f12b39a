// keel's models in Hugging Face transformers' layout, both ways (`keel export --format hf`,
// `keel train --init-from HF_DIR`):
//   arch llama, qk_norm off    LlamaForCausalLM  (model_type llama)
//   arch llama, qk_norm on     Qwen3ForCausalLM  (model_type qwen3: Llama plus an RMSNorm over each
//                              head of q and k before the rotary, exactly keel's qk_norm; llama's
//                              default, auto)
//   arch gpt2                  GPT2LMHeadModel   (model_type gpt2; needs n_kv_heads = n_heads and
//                              qk_norm off, its auto: GPT-2 has no q/k norms)
// Tensor names (legend: C d_model, H heads, Hkv kv heads, D head dim, F MLP width, V vocabulary):
//   keel                        llama / qwen3 (model.)               gpt2 (transformer.)
//   tok_emb.weight (V, C)       embed_tokens.weight                  wte.weight
//   pos_emb.weight (T, C)       -                                    wpe.weight
//   layers.i.attn_norm.*        layers.i.input_layernorm.*           h.i.ln_1.*
//   layers.i.attn.qkv.*         layers.i.self_attn.{q,k,v}_proj:     h.i.attn.c_attn.*
//     ((H + 2 Hkv) D, C)        rows [q HD | k HkvD | v HkvD]        (C, 3C): transposed
//   layers.i.attn.{q,k}_norm.*  layers.i.self_attn.{q,k}_norm.*      -
//   layers.i.attn.proj.*        layers.i.self_attn.o_proj.*          h.i.attn.c_proj.*: transposed
//   layers.i.mlp_norm.*         layers.i.post_attention_layernorm.*  h.i.ln_2.*
//   layers.i.mlp.fc.* (2F, C)   layers.i.mlp.{gate,up}_proj:         h.i.mlp.c_fc.*: transposed
//                               rows [gate F | up F]
//   layers.i.mlp.proj.*         layers.i.mlp.down_proj.*             h.i.mlp.c_proj.*: transposed
//   final_norm.*                norm.*                               ln_f.*
//   lm_head.weight              lm_head.weight (absent when tied, in both)
// GPT-2's Conv1D stores weights (in, out), the transpose of nn.Linear; its 1-D biases stay as they
// are. keel's rotary rotates the two halves of each head, as transformers' rotate_half, so q and k
// need no permutation. Both directions only slice, concatenate and transpose: export, init-from
// and export again gives the same bytes.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/tensor_file.h"
#include "config/schema.h"

namespace keel::checkpoint {

// keel's fixed numerics, which config.json must state for transformers to compute the same.
inline constexpr double kHfNormEps = 1e-5;
inline constexpr double kHfRopeTheta = 10000.0;

// The transformers class `m` maps to ("LlamaForCausalLM", "Qwen3ForCausalLM", "GPT2LMHeadModel");
// ConfigError naming the model.* key when there is none.
std::string hf_architecture(const config::ModelConfig& m);

// Token ids config.json and generation_config.json name; absent for a model without a tokenizer
// (synthetic data).
struct HfTokenIds {
  std::optional<int64_t> bos, eos;
};

// config.json for `m`: every field transformers needs to build the same model.
nlohmann::json hf_config(const config::ModelConfig& m, const HfTokenIds& tokens);
// generation_config.json: the token ids, greedy by default.
nlohmann::json hf_generation_config(const HfTokenIds& tokens);

// keel's named tensors (model.safetensors of a checkpoint) -> transformers' names and layouts,
// fp32, contiguous. CheckpointError naming `source` when a tensor the config implies is missing,
// has another shape, or one is there that the model does not have.
TensorMap to_hf_tensors(const TensorMap& keel, const config::ModelConfig& m,
                        const std::string& source);
// Rows [first, first + rows) along dim 0 of keel's tensor `name`, in its shape but for dim 0.
using KeelRows = std::function<torch::Tensor(const std::string& name, int64_t first, int64_t rows)>;

// to_hf_tensors written as `path` (model.safetensors, metadata {"format": "pt"}) one HF tensor at
// a time, each made from the rows of keel's tensor it holds alone, read through `rows`: memory
// for one tensor, whatever the model's size (keel export). `keel_shapes`: keel's tensors and
// their shapes, checked as to_hf_tensors checks. The bytes write_safetensors would write.
FileDigest write_hf_weights(const std::filesystem::path& path, const config::ModelConfig& m,
                            const std::map<std::string, std::vector<int64_t>>& keel_shapes,
                            const KeelRows& rows, const std::string& source);

// The inverse. Also reads GPT-2 files saved without the "transformer." prefix, converts other
// float dtypes to fp32, and ignores what transformers itself ignores (GPT-2's attn.bias and
// attn.masked_bias buffers, rotary inv_freq, lm_head.weight of a tied model).
TensorMap from_hf_tensors(const TensorMap& hf, const config::ModelConfig& m,
                          const std::string& source);

// Each way `hf` (a parsed config.json, read from `file`) disagrees with `m`, one line each:
// "hidden_size 128 in FILE, model.d_model 64 in the config". Empty when they agree.
std::vector<std::string> hf_config_mismatches(const nlohmann::json& hf,
                                              const config::ModelConfig& m,
                                              const std::string& file);

// Reads DIR/config.json and throws ConfigError listing every mismatch with `m` (CheckpointError
// when DIR or its config.json cannot be read): the cheap check `keel train --init-from` makes
// before it starts anything.
void check_hf_config(const std::filesystem::path& dir, const config::ModelConfig& m);

// model.qk_norm of the keel model a transformers config.json (`hf`) describes, from its model_type:
// qwen3 on, llama and gpt2 off; nullopt for any other (check_hf_config then names it). `keel train
// --init-from` gives an auto model.qk_norm this value, so that a Llama starts a Llama.
inline std::optional<config::Switch> hf_qk_norm(const nlohmann::json& hf) {
  if (!hf.is_object() || !hf.contains("model_type")) return std::nullopt;
  const nlohmann::json& type = hf.at("model_type");
  if (type == "qwen3") return config::Switch::kOn;
  if (type == "llama" || type == "gpt2") return config::Switch::kOff;
  return std::nullopt;
}

// A Hugging Face model directory read one of keel's tensors at a time (`keel train --init-from`,
// which never holds a second copy of the model, and under ZeRO-3 reads unit by unit): config.json
// is checked against `m` first (check_hf_config), then the headers of model.safetensors, or of
// the files model.safetensors.index.json names. Every tensor keel's model needs must be there with
// its shape and a floating dtype, and none it has no place for: CheckpointError otherwise, before
// any weight is read.
class HfModelReader {
 public:
  HfModelReader(const std::filesystem::path& dir, const config::ModelConfig& m);
  // keel's tensor names, in the model's order.
  std::vector<std::string> names() const;
  // keel's tensor `name` (fp32, CPU, contiguous), read from its HF tensors alone.
  torch::Tensor read(const std::string& name) const;

 private:
  struct Index;
  std::shared_ptr<const Index> index_;
};

// Every tensor of HfModelReader(dir, m), in one map.
TensorMap read_hf_model(const std::filesystem::path& dir, const config::ModelConfig& m);

}  // namespace keel::checkpoint
