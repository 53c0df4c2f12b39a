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
