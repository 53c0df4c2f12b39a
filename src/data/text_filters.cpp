#include "data/text_filters.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "data/shard_format.h"

namespace keel::data {

std::string normalize_text(std::string_view text) {
  // Written through a pointer into a buffer of the input's size (the output is never longer):
  // appending a byte at a time made this a tenth of prepare's time.
  std::string out(text.size(), '\0');
  char* const begin = out.data();
  char* p = begin;
  bool space = false;
  for (unsigned char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      space = p != begin;
      continue;
    }
    if (space) *p++ = ' ';
    space = false;
    *p++ = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  out.resize(static_cast<size_t>(p - begin));
  return out;
}

namespace {

// The window hashes one document has seen: open addressing in a power-of-two table kept at most
// half full, reused by the thread from document to document. A node-based set made one heap
// allocation per byte of input, and the allocator, not the hashing, bounded prepare's threads.
class WindowSet {
 public:
  explicit WindowSet(size_t n) : table_(storage()) {
    const size_t cap = std::bit_ceil(std::max<size_t>(2 * n, 16));
    shift_ = 64 - std::countr_zero(cap);
    table_.assign(cap, 0);
  }
  // False when `h` was there already.
  bool insert(uint64_t h) {
    if (h == 0) return !std::exchange(has_zero_, true);  // 0 marks an empty slot
    const size_t mask = table_.size() - 1;
    for (size_t i = (h * 0x9E3779B97F4A7C15ULL) >> shift_;; i = (i + 1) & mask) {
      if (table_[i] == h) return false;
      if (table_[i] == 0) {
        table_[i] = h;
        return true;
      }
    }
  }

 private:
  static std::vector<uint64_t>& storage() {
    thread_local std::vector<uint64_t> table;
    return table;
  }
  std::vector<uint64_t>& table_;
  int shift_ = 0;
  bool has_zero_ = false;
};

}  // namespace

double repeated_share(std::string_view text) {
  const size_t n = text.size();
  if (n < 2 * kRepeatSpan) return 0.0;
  // A polynomial rolling hash of every kRepeatSpan-byte window; a window seen before marks its
  // bytes as repeated (a 64-bit hash collision would mark one window wrongly: negligible).
  constexpr uint64_t kBase = 0x100000001b3ULL;
  uint64_t drop = 1;  // kBase^(kRepeatSpan-1), to remove the byte leaving the window
  for (size_t i = 1; i < kRepeatSpan; ++i) drop *= kBase;
  WindowSet seen(n);
  uint64_t h = 0;
  for (size_t i = 0; i < kRepeatSpan; ++i) h = h * kBase + static_cast<unsigned char>(text[i]);
  size_t covered = 0, covered_until = 0;  // bytes [.., covered_until) already counted
  for (size_t start = 0;; ++start) {
    if (!seen.insert(h)) {
      const size_t from = std::max(start, covered_until), to = start + kRepeatSpan;
      covered += to - from;
      covered_until = to;
    }
    if (start + kRepeatSpan >= n) break;
    h = (h - drop * static_cast<unsigned char>(text[start])) * kBase +
        static_cast<unsigned char>(text[start + kRepeatSpan]);
  }
  return static_cast<double>(covered) / static_cast<double>(n);
}

double top_char_share(std::string_view text) {
  std::array<int64_t, 128> ascii{};
  std::unordered_map<uint32_t, int64_t> other;
  int64_t total = 0;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') continue;
      ++ascii[c];
    } else {
      // A lead byte and its continuation bytes are one character; stray bytes count alone.
      const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      uint32_t code = c;
      size_t j = 1;
      for (; j < len && i + j < text.size() &&
             (static_cast<unsigned char>(text[i + j]) & 0xC0) == 0x80;
           ++j)
        code = code << 8 | static_cast<unsigned char>(text[i + j]);
      ++other[code];
      i += j;
    }
    ++total;
  }
  if (total < kTopCharMinChars) return 0.0;
  int64_t top = *std::max_element(ascii.begin(), ascii.end());
  for (const auto& [code, count] : other) top = std::max(top, count);
  return static_cast<double>(top) / static_cast<double>(total);
}

std::string_view repetition_verdict(const RepetitionRules& rules, std::string_view text) {
  if (rules.max_top_char_share > 0 && top_char_share(text) > rules.max_top_char_share)
    return "one_character";
  if (rules.max_repeated_share > 0 && repeated_share(text) > rules.max_repeated_share)
    return "repeated_spans";
  return {};
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
