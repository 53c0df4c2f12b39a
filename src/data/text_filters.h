// Text normalisation for exact dedup, and the document-length filter of `keel prepare`: hard
// min/max bounds plus percentile tails, with a histogram and a count of what each rule removed.
// Lengths are in bytes of the document's UTF-8 text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace keel::data {

// Lower-cases ASCII, collapses every run of whitespace to one space and trims both ends, so that
// documents differing only in case or spacing hash alike.
std::string normalize_text(std::string_view text);
// xxh3 of normalize_text(text).
uint64_t normalized_hash(std::string_view text);

struct LengthRules {
  int64_t min_length = 1;            // documents shorter than this are removed (bytes)
  int64_t max_length = 0;            // longer than this removed; 0 = no maximum
  double drop_percentile_tails = 0;  // P: also remove below the P-th and above the (100-P)-th
                                     // percentile of the lengths that passed the hard bounds
};

// The repetition filter of `keel prepare`: documents that are mostly repeats of themselves — one
// character over and over, a template pasted several times, a converter's loop — carry almost no
// information, and a model learns them so fast that their loss stays low, below anything a
// high-loss screen at training time catches. After Gopher's repetition rules (Rae et al. 2021),
// measured on bytes so they hold for any language and for code.
struct RepetitionRules {
  double max_repeated_share = 0;  // remove when more than this share of the bytes repeats an
                                  // earlier kRepeatSpan-byte span of the same document (0 = off)
  double max_top_char_share = 0;  // remove when one character is more than this share of the
                                  // non-whitespace characters (0 = off)
};

// Spans shorter than this are the vocabulary of ordinary text (a repeated phrase or name).
inline constexpr size_t kRepeatSpan = 32;
// One character dominating a shorter text is a rule line or an emphasis, not a broken document.
inline constexpr int64_t kTopCharMinChars = 32;

// The share of `text`'s bytes covered by a kRepeatSpan-byte span that occurred earlier in it
// (overlaps included, so a run of one character counts whole); 0 for texts under 2 spans.
double repeated_share(std::string_view text);
// The share of the non-whitespace characters (UTF-8 code points) that are the most common one; 0
// below kTopCharMinChars of them.
double top_char_share(std::string_view text);

// Why RepetitionRules remove `text`: "repeated_spans", "one_character", or empty to keep it.
std::string_view repetition_verdict(const RepetitionRules& rules, std::string_view text);

// Decides, for a whole corpus's lengths, which documents the rules remove.
class LengthFilter {
 public:
  LengthFilter(LengthRules rules, const std::vector<int64_t>& lengths);
  bool keep(int64_t length) const;
  int64_t low_cut() const { return low_; }  // kept lengths are in [low_cut, high_cut]
  int64_t high_cut() const { return high_; }
  // {rules, cuts, removed: {below_min, above_max, low_tail, high_tail}, histogram}
  nlohmann::json report() const;
  int64_t removed() const { return below_min_ + above_max_ + low_tail_ + high_tail_; }

 private:
  LengthRules rules_;
  int64_t low_, high_;
  int64_t below_min_ = 0, above_max_ = 0, low_tail_ = 0, high_tail_ = 0;
  std::vector<int64_t> histogram_;  // power-of-two bins: [0,1), [1,2), [2,4), ...
};

}  // namespace keel::data
