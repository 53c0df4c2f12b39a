// Hugging Face tokenizer.json with a BPE model (GPT-2, Llama-3, Qwen, cl100k-style), encoded as
// the tokenizers library encodes with add_special_tokens=False:
//   1. added tokens are split out first (leftmost, longest; lstrip, rstrip and single_word
//      honoured; normalized ones matched after the normalizer);
//   2. the normalizer: none or NFC (utf8proc), alone or in a Sequence;
//   3. the pre-tokenizers: Split (a Regex or a String; every behavior; invert), ByteLevel
//      (add_prefix_space; use_regex with GPT-2's pattern) and Digits, alone or in a Sequence;
//   4. BPE: merges applied by rank (leftmost first among equals), ignore_merges (a word already
//      in the vocabulary is one token), byte_fallback (<0xXX> tokens), unk_token and fuse_unk,
//      continuing_subword_prefix and end_of_word_suffix.
// A component keel does not run (another normalizer, Metaspace, BPE dropout) is refused with the
// file and the component's name, never approximated. The document boundary is the eos_token of
// the tokenizer_config.json beside the file, else the first of the special tokens
// <|endoftext|>, <|end_of_text|>, </s>, <eos> it holds.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace keel::data {

// Loads `path` (a tokenizer.json). `boundary_token`: the boundary's text, or empty to find it as
// above. DataError (exit 2) naming the file and what is wrong or unsupported.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path,
                                             const std::string& boundary_token = "");

}  // namespace keel::data
