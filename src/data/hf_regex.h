// The regular expressions of Hugging Face tokenizer.json pre-tokenizers (GPT-2's, Llama-3's and
// cl100k's Split patterns: Unicode classes, lookahead, possessive quantifiers), run by PCRE2 with
// its JIT. tokenizers runs them with Oniguruma; the two agree on these patterns but for two things,
// which keel makes Oniguruma's: its \s is Unicode's White_Space, which holds U+0085 (NEL) where
// PCRE2's does not (the pattern is rewritten to add it), and its ^ and $ are line anchors
// (PCRE2_MULTILINE). RE2 is no choice: it refuses lookahead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace keel::data {

class HfRegex {
 public:
  // `pattern` in tokenizers' syntax. DataError naming `where` and PCRE2's complaint when it
  // cannot be compiled.
  HfRegex(const std::string& pattern, const std::string& where);
  ~HfRegex();
  HfRegex(const HfRegex&) = delete;
  HfRegex& operator=(const HfRegex&) = delete;

  // Appends the [begin, end) byte ranges of the matches of `text` (valid UTF-8), left to right
  // and never overlapping, as tokenizers' find_iter gives them. Thread-safe. DataError naming
  // the pattern's origin (`where`) when PCRE2 gives up on the text (its match limit).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  std::string where_;
};

// How a Split pre-tokenizer groups the matches and the text between them (tokenizers'
// SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// tokenizers' NormalizedString::split: appends the non-empty pieces of `text` around the matches
// of `re` (with `invert`, the text between matches is what matched) grouped by `behavior`.
void split_pieces(const HfRegex& re, std::string_view text, SplitBehavior behavior, bool invert,
                  std::vector<std::string>& out);

// The code point of the UTF-8 character at byte `i` of `s`, its length in `*len`; a byte that
// starts no valid character is itself, length 1.
uint32_t utf8_at(std::string_view s, size_t i, size_t* len);
// The byte where the character that ends at byte `i` of `s` starts (i > 0).
size_t utf8_before(std::string_view s, size_t i);

// `literal` as a pattern that matches exactly it (a Split pre-tokenizer's {"String": ...}).
std::string regex_escape(std::string_view literal);

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD (tokenizers takes only
// strings; a document that is not UTF-8 has no encoding there to agree with).
std::string valid_utf8(std::string_view text);

}  // namespace keel::data
