// Tokenizers for `keel prepare` and for decoding served samples:
//   byte      bytes 0..255 are their own ids; id 256 is the document boundary <|endoftext|>;
//             vocab_size 257 (a model needs model.vocab_size >= 257; 264 keeps it a multiple of 8)
//   spm:FILE  a SentencePiece model; the boundary is its </s> (eos) id
//   spm-train:VOCAB  trains a SentencePiece (unigram, byte fallback) model on the prepared text
//   hf:FILE   a Hugging Face tokenizer.json with a BPE model (data/hf_bpe.h); the boundary is its
//             eos token
//   ids       pre-tokenized data (data.source megatron / llmc) carries no tokenizer: decoding shows
//             the ids, encoding is refused
// encode() and decode() are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace keel::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` to `out` (no boundary token).
  virtual void encode(std::string_view text, std::vector<uint32_t>& out) const = 0;
  // Best-effort text of `ids`; boundary tokens appear as "<|endoftext|>".
  virtual std::string decode(const int64_t* ids, size_t n) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual uint32_t boundary_id() const = 0;
  // The "tokenizer" entry of meta.json; tokenizer_from_meta() reads it back.
  virtual nlohmann::json describe() const = 0;
};

inline constexpr uint32_t kByteBoundaryId = 256;
inline constexpr const char* kBoundaryText = "<|endoftext|>";

std::unique_ptr<Tokenizer> make_byte_tokenizer();
std::unique_ptr<Tokenizer> make_id_tokenizer(int64_t vocab_size, uint32_t boundary_id);
// Loads a SentencePiece model file; throws DataError naming it when it cannot.
std::unique_ptr<Tokenizer> load_spm_tokenizer(const std::string& model_path);
// Trains a SentencePiece model on `text_file` (one sentence per line); writes PREFIX.model and
// PREFIX.vocab. Throws DataError when SentencePiece refuses (e.g. a vocabulary too large for the
// text).
void train_spm(const std::string& text_file, int64_t vocab_size, const std::string& model_prefix,
               int threads, uint64_t seed);
// The tokenizer meta.json in `dir` describes.
std::unique_ptr<Tokenizer> tokenizer_from_meta(const nlohmann::json& tokenizer,
                                               const std::string& dir);

}  // namespace keel::data
