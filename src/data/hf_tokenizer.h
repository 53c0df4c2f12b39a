// A prepared dataset's tokenizer as Hugging Face tokenizer files, which transformers'
// AutoTokenizer loads (`keel export --format hf`):
//   byte  tokenizer.json: a byte-level BPE without merges whose vocabulary is GPT-2's
//         byte-to-unicode map (id = byte value), id 256 "<|endoftext|>" a special token (the
//         boundary: eos, and bos as GPT-2 has it); ByteLevel pre-tokenizer and decoder without the
//         GPT-2 regex, so every byte string encodes to its bytes, as keel's byte tokenizer does
//   spm   tokenizer.model copied. A unigram model (keel's spm-train) also gets a tokenizer.json
//         rebuilt from the model file as transformers' SpmConverter would (Unigram with byte
//         fallback, SentencePiece's precompiled normalizer, Metaspace): transformers' own
//         LlamaTokenizer reads a .model as BPE and would split a unigram model's text otherwise.
//         A BPE model is left to LlamaTokenizer. SentencePiece breaks ties between equal-score
//         segmentations differently from tokenizers' Unigram ("...." as "..." + "." or "." +
//         "..."): rare, and both are valid encodings the model was trained on.
//   hf    the tokenizer.json prepare was given (--tokenizer hf:FILE), byte for byte, with a
//         tokenizer_config.json naming its boundary token
// keel adds no bos or eos when it encodes: tokenizer_config.json says so (add_bos_token false).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace keel::data {

struct HfTokenizerFiles {
  std::string kind;                // "byte" | "spm" | "hf"
  int64_t bos_id = 0, eos_id = 0;  // eos: the boundary between documents
  std::vector<std::string> files;  // written into the output directory
  std::string note;                // a caveat for the user, or empty
};

// Writes the tokenizer of the prepared dataset in `data_dir` (its meta.json) into `out_dir`.
// `model_max_length`: the model's context (model.seq_len). DataError naming the file when
// meta.json or the SentencePiece model cannot be read or the tokenizer kind is unknown.
HfTokenizerFiles write_hf_tokenizer(const std::filesystem::path& data_dir,
                                    const std::filesystem::path& out_dir, int64_t model_max_length);

// GPT-2's reversible byte -> printable unicode character map (UTF-8), indexed by byte value.
const std::vector<std::string>& gpt2_byte_chars();

}  // namespace keel::data
