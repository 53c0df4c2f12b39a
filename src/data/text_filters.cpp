#include "data/text_filters.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "data/shard_format.h"

namespace keel::data {

std::string normalize_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool space = false;
  for (unsigned char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  return out;
}

uint64_t normalized_hash(std::string_view text) {
  auto n = normalize_text(text);
  return xxh3(n.data(), n.size());
}

namespace {

int bin_of(int64_t length) {
  return length <= 0 ? 0 : std::bit_width(static_cast<uint64_t>(length));
}

}  // namespace

LengthFilter::LengthFilter(LengthRules rules, const std::vector<int64_t>& lengths) : rules_(rules) {
  int64_t hard_max = rules.max_length > 0 ? rules.max_length : std::numeric_limits<int64_t>::max();
  std::vector<int64_t> passed;
  for (int64_t n : lengths) {
    int b = bin_of(n);
    if (static_cast<int>(histogram_.size()) <= b) histogram_.resize(b + 1);
    ++histogram_[b];
    if (n < rules.min_length)
      ++below_min_;
    else if (n > hard_max)
      ++above_max_;
    else
      passed.push_back(n);
  }
  low_ = rules.min_length;
  high_ = hard_max;
  if (rules.drop_percentile_tails > 0 && !passed.empty()) {
    std::sort(passed.begin(), passed.end());
    double p = std::min(rules.drop_percentile_tails, 50.0) / 100.0;
    // Nearest-rank percentiles: remove the floor(p*n) shortest and longest, resolving ties by
    // length (documents of equal length are treated alike).
    size_t k = static_cast<size_t>(std::floor(p * passed.size()));
    if (k > 0) {
      low_ = std::max(low_, passed[k]);
      high_ = std::min(high_, passed[passed.size() - 1 - k]);
    }
    for (int64_t n : passed) {
      if (n < low_)
        ++low_tail_;
      else if (n > high_)
        ++high_tail_;
    }
  }
}

bool LengthFilter::keep(int64_t length) const { return length >= low_ && length <= high_; }

nlohmann::json LengthFilter::report() const {
  nlohmann::json bins = nlohmann::json::array();
  for (size_t b = 0; b < histogram_.size(); ++b) {
    int64_t lo = b == 0 ? 0 : int64_t{1} << (b - 1);
    int64_t hi = (int64_t{1} << b) - 1;
    if (histogram_[b]) bins.push_back({{"min", lo}, {"max", hi}, {"documents", histogram_[b]}});
  }
  return {{"min_length", rules_.min_length},
          {"max_length", rules_.max_length},
          {"drop_percentile_tails", rules_.drop_percentile_tails},
          {"kept_range", {low_, high_ == std::numeric_limits<int64_t>::max() ? -1 : high_}},
          {"removed",
           {{"below_min", below_min_},
            {"above_max", above_max_},
            {"low_tail", low_tail_},
            {"high_tail", high_tail_}}},
          {"histogram", bins}};
}

}  // namespace keel::data
