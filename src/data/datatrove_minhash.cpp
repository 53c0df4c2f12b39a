#include "data/datatrove_minhash.h"

#include <utf8proc.h>
#include <xxhash.h>

#include <algorithm>
#include <compare>
#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>

#include "data/spacy_en_words.h"

namespace keel::data {
namespace {

constexpr uint64_t kMersenne61 = (uint64_t{1} << 61) - 1;
// A byte that is not UTF-8 travels through the steps as this plus its value, touched by none.
constexpr char32_t kRawByte = 0x110000;

bool valid(char32_t c) { return c < kRawByte; }

utf8proc_category_t category(char32_t c) {
  return valid(c) ? utf8proc_category(static_cast<utf8proc_int32_t>(c)) : UTF8PROC_CATEGORY_CN;
}

std::vector<char32_t> decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n > 0) {
      out.push_back(static_cast<char32_t>(cp));
      i += static_cast<size_t>(n);
    } else {
      out.push_back(kRawByte + c);
      ++i;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (!valid(c)) {
    out.push_back(static_cast<char>(c - kRawByte));
  } else if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else {
    utf8proc_uint8_t buf[4];
    const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
    out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
  }
}

// Python's str.isspace(), which `re`'s \s, str.strip() and str.split() use.
bool is_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20);
  return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
         c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// datatrove.utils.text.PUNCTUATION: its characters and the control characters but tab and newline.
bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    if (c < 0x20) return c != 0x09 && c != 0x0a;
    return c == 0x7f || (c > 0x20 && c < 0x30) || (c >= 0x3a && c <= 0x40) ||
           (c >= 0x5b && c <= 0x60) || (c >= 0x7b && c <= 0x7e);
  }
  if (c < 0xa0) return true;  // 0x80-0x9f
  static constexpr char32_t kOthers[] = {0xab,   0xb4,   0xbb,   0x2013, 0x2014, 0x2019, 0x201c,
                                         0x201d, 0x201e, 0x2026, 0x2236, 0x2501, 0x25ba, 0x3001,
                                         0x3002, 0x3008, 0x3009, 0x300a, 0x300b, 0x300c, 0x300d,
                                         0x3010, 0x3011, 0xff01, 0xff05, 0xff08, 0xff09, 0xff0c,
                                         0xff0e, 0xff11, 0xff1a, 0xff1b, 0xff1f, 0xff5e};
  return std::binary_search(std::begin(kOthers), std::end(kOthers), c);
}

// Unicode's Cased (Lu, Ll, Lt, Other_Lowercase, Other_Uppercase; the latter two by their ranges,
// the supplementary planes' Lm ones left out) and Case_Ignorable, which Python's final-sigma rule
// reads.
bool is_cased(char32_t c) {
  const auto cat = category(c);
  if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT)
    return true;
  struct Range {
    char32_t lo, hi;
  };
  static constexpr Range kOther[] = {
      {0xaa, 0xaa},       {0xba, 0xba},       {0x2b0, 0x2b8},    {0x2c0, 0x2c1},   {0x2e0, 0x2e4},
      {0x345, 0x345},     {0x37a, 0x37a},     {0x1d2c, 0x1d6a},  {0x1d78, 0x1d78}, {0x1d9b, 0x1dbf},
      {0x2071, 0x2071},   {0x207f, 0x207f},   {0x2090, 0x209c},  {0x2160, 0x217f}, {0x24b6, 0x24e9},
      {0x2c7c, 0x2c7d},   {0xa69c, 0xa69d},   {0xa770, 0xa770},  {0xa7f8, 0xa7f9}, {0xab5c, 0xab5f},
      {0x1f130, 0x1f149}, {0x1f150, 0x1f169}, {0x1f170, 0x1f189}};
  for (const Range& r : kOther)
    if (c >= r.lo && c <= r.hi) return true;
  return false;
}

bool is_case_ignorable(char32_t c) {
  switch (category(c)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      break;
  }
  // Word_Break MidLetter, MidNumLet and Single_Quote.
  static constexpr char32_t kMid[] = {0x27,   0x2e,   0x3a,   0xb7,   0x387,  0x55f,
                                      0x5f4,  0x2018, 0x2019, 0x2024, 0x2027, 0xfe13,
                                      0xfe52, 0xfe55, 0xff07, 0xff0e, 0xff1a};
  return std::binary_search(std::begin(kMid), std::end(kMid), c);
}

// Python's rule for U+03A3: final (ς) after a cased letter and not before one, case-ignorable
// characters skipped on both sides.
bool final_sigma(const std::vector<char32_t>& s, size_t i) {
  size_t j = i;
  while (j > 0 && is_case_ignorable(s[j - 1])) --j;
  if (j == 0 || !is_cased(s[j - 1])) return false;
  size_t k = i + 1;
  while (k < s.size() && is_case_ignorable(s[k])) ++k;
  return k == s.size() || !is_cased(s[k]);
}

std::vector<char32_t> lower(const std::vector<char32_t>& s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    } else if (c == 0x130) {  // the one unconditional full mapping longer than one character
      out.push_back('i');
      out.push_back(0x307);
    } else if (c == 0x3a3) {
      out.push_back(final_sigma(s, i) ? 0x3c2 : 0x3c3);
    } else {
      out.push_back(valid(c) ? static_cast<char32_t>(utf8proc_tolower(static_cast<int32_t>(c)))
                             : c);
    }
  }
  return out;
}

bool is_digit(char32_t c) {
  return c < 0x80 ? c >= '0' && c <= '9' : category(c) == UTF8PROC_CATEGORY_ND;
}

bool is_decimal_separator(char32_t c) {
  return c == '.' || c == ',' || c == 0x60c || c == 0x66b || c == 0x2396 || c == 0x2397 ||
         c == 0x2398;
}

// NUMBERS_PATTERN.sub("0", ...): \p{Nd}+([.,،٫⎖⎗⎘]\p{Nd}+)?
std::vector<char32_t> numbers_to_zero(const std::vector<char32_t>& s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (!is_digit(s[i])) {
      out.push_back(s[i++]);
      continue;
    }
    while (i < s.size() && is_digit(s[i])) ++i;
    if (i + 1 < s.size() && is_decimal_separator(s[i]) && is_digit(s[i + 1])) {
      ++i;
      while (i < s.size() && is_digit(s[i])) ++i;
    }
    out.push_back('0');
  }
  return out;
}

// WHITESPACE_PATTERN.sub(" ", text.strip()) after punctuation became spaces.
std::vector<char32_t> punctuation_and_whitespace(const std::vector<char32_t>& s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  bool pending_space = false;
  for (char32_t c : s) {
    if (is_punctuation(c) || is_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

// unicodedata.normalize("NFD", ...) with the Mn characters dropped, then stripped.
std::string decompose_without_marks(const std::vector<char32_t>& s) {
  std::vector<char32_t> nfd;
  nfd.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80 || !valid(c)) {
      nfd.push_back(c);
      continue;
    }
    utf8proc_int32_t buf[16];
    int boundclass = UTF8PROC_BOUNDCLASS_START;
    const auto n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), buf, 16,
                                           UTF8PROC_DECOMPOSE, &boundclass);
    if (n <= 0 || n > 16) {
      nfd.push_back(c);
      continue;
    }
    for (utf8proc_ssize_t k = 0; k < n; ++k) nfd.push_back(static_cast<char32_t>(buf[k]));
  }
  auto ccc = [](char32_t c) {
    return c < 0x80 || !valid(c)
               ? 0
               : utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class;
  };
  // The canonical order: each run of combining characters stably sorted by combining class.
  for (size_t i = 0; i < nfd.size();) {
    if (ccc(nfd[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < nfd.size() && ccc(nfd[j]) != 0) ++j;
    std::stable_sort(nfd.begin() + static_cast<std::ptrdiff_t>(i),
                     nfd.begin() + static_cast<std::ptrdiff_t>(j),
                     [&](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  std::vector<char32_t> kept;
  kept.reserve(nfd.size());
  for (char32_t c : nfd)
    if (c < 0x80 || category(c) != UTF8PROC_CATEGORY_MN) kept.push_back(c);
  size_t begin = 0, end = kept.size();
  while (begin < end && is_space(kept[begin])) ++begin;
  while (end > begin && is_space(kept[end - 1])) --end;
  std::string out;
  out.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) append_utf8(out, kept[i]);
  return out;
}

// numpy's legacy RandomState(seed).randint(low, high, dtype=np.uint64): masked rejection over
// MT19937's 64-bit draws (high word first).
class NumpyLegacyRandom {
 public:
  explicit NumpyLegacyRandom(uint32_t seed) : mt_(seed) {}
  uint64_t randint(uint64_t low, uint64_t high) {
    const uint64_t range = high - 1 - low;
    uint64_t mask = range;
    for (int shift = 1; shift < 64; shift <<= 1) mask |= mask >> shift;
    uint64_t v = 0;
    do {
      const uint64_t hi = mt_();
      v = ((hi << 32) | mt_()) & mask;
    } while (v > range);
    return low + v;
  }

 private:
  std::mt19937 mt_;
};

uint64_t mod_mersenne61(uint64_t x) {
  const uint64_t r = (x & kMersenne61) + (x >> 61);
  return r >= kMersenne61 ? r - kMersenne61 : r;
}

// The same steps over ASCII text in one pass: no final sigma, decomposition or marks there.
std::string simplify_ascii(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool pending_space = false;
  auto digit = [&](size_t i) { return i < s.size() && s[i] >= '0' && s[i] <= '9'; };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (!digit(i) && (is_punctuation(c) || is_space(c))) {
      pending_space = !out.empty();
      ++i;
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    if (!digit(i)) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      ++i;
      continue;
    }
    while (digit(i)) ++i;
    if (i < s.size() && (s[i] == '.' || s[i] == ',') && digit(i + 1)) {
      ++i;
      while (digit(i)) ++i;
    }
    out.push_back('0');
  }
  return out;
}

}  // namespace

std::string datatrove_simplify(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; }))
    return simplify_ascii(text);
  return decompose_without_marks(punctuation_and_whitespace(numbers_to_zero(lower(decode(text)))));
}

DatatroveMinHasher::DatatroveMinHasher(int ngrams, int hashes, uint32_t seed) : ngrams_(ngrams) {
  if (ngrams < 1 || hashes < 1) throw std::invalid_argument("ngrams and hashes must be positive");
  NumpyLegacyRandom rng(seed);
  for (int i = 0; i < hashes; ++i) a_.push_back(rng.randint(1, kMersenne61));
  for (int i = 0; i < hashes; ++i) b_.push_back(rng.randint(0, kMersenne61));
}

std::vector<uint64_t> DatatroveMinHasher::shingles(std::string_view text) const {
  const std::string simple = datatrove_simplify(text);
  std::vector<std::string_view> words;
  spacy_en_words(simple, words);
  // The words joined by one space, so that an n-gram is a slice.
  std::string joined;
  joined.reserve(simple.size() + words.size());
  std::vector<size_t> starts, ends;
  for (std::string_view w : words) {
    if (!joined.empty()) joined.push_back(' ');
    starts.push_back(joined.size());
    joined.append(w);
    ends.push_back(joined.size());
  }
  std::vector<uint64_t> out;
  const auto n = static_cast<size_t>(ngrams_);
  for (size_t w = 0; w + n <= starts.size(); ++w)
    out.push_back(XXH64(joined.data() + starts[w], ends[w + n - 1] - starts[w], 0));
  return out;
}

std::vector<uint64_t> DatatroveMinHasher::signature(std::string_view text) const {
  const std::vector<uint64_t> sh = shingles(text);
  if (sh.empty()) return {};
  const size_t h = a_.size();
  std::vector<uint64_t> sig(h, UINT64_MAX);
  for (uint64_t x : sh)
    for (size_t i = 0; i < h; ++i) sig[i] = std::min(sig[i], mod_mersenne61(x * a_[i] + b_[i]));
  return sig;
}

DatatroveClusters::DatatroveClusters(int buckets, int rows) : buckets_(buckets), rows_(rows) {
  if (buckets < 1 || rows < 1) throw std::invalid_argument("buckets and rows must be positive");
}

void DatatroveClusters::add(int64_t doc, std::span<const uint64_t> signature) {
  if (signature.size() != static_cast<size_t>(buckets_) * rows_)
    throw std::invalid_argument("a signature of " + std::to_string(signature.size()) +
                                " values, expected " + std::to_string(buckets_ * rows_));
  docs_.push_back(doc);
  values_.insert(values_.end(), signature.begin(), signature.end());
}

std::vector<int64_t> DatatroveClusters::removed() {
  const size_t n = docs_.size(), width = static_cast<size_t>(buckets_) * rows_;
  std::vector<size_t> parent(n), size(n, 1);
  std::iota(parent.begin(), parent.end(), size_t{0});
  auto find = [&](size_t x) {
    size_t root = x;
    while (parent[root] != root) root = parent[root];
    while (parent[x] != root) x = std::exchange(parent[x], root);
    return root;
  };
  std::vector<size_t> order(n);
  pairs_ = 0;
  for (int bucket = 0; bucket < buckets_; ++bucket) {
    const size_t offset = static_cast<size_t>(bucket) * rows_;
    auto band = [&](size_t i) { return values_.data() + i * width + offset; };
    std::iota(order.begin(), order.end(), size_t{0});
    // By the band's values, then by document (the order ids were added in).
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      const auto c = std::lexicographical_compare_three_way(band(x), band(x) + rows_, band(y),
                                                            band(y) + rows_);
      return c != 0 ? c < 0 : x < y;
    });
    for (size_t k = 1; k < n; ++k) {
      if (!std::equal(band(order[k - 1]), band(order[k - 1]) + rows_, band(order[k]))) continue;
      ++pairs_;
      size_t ra = find(order[k - 1]), rb = find(order[k]);
      if (ra == rb) continue;
      if (size[ra] < size[rb]) std::swap(ra, rb);
      parent[rb] = ra;
      size[ra] += size[rb];
    }
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i)
    if (find(i) != i) out.push_back(docs_[i]);
  return out;
}

}  // namespace keel::data
