// Near-duplicate detection: MinHash signatures over word or character shingles, banded
// locality-sensitive hashing to find candidate pairs, and a signature-agreement check against the
// Jaccard threshold. With b bands of r rows (num_perm = b*r) a pair of Jaccard similarity s becomes
// a candidate with probability 1 - (1 - s^r)^b; the default 128 = 16 x 8 makes that 0.994 at
// s = 0.85 and 0.24 at s = 0.6, and the signature check then removes candidates below threshold.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace keel::data {

// keel's own scheme (this file), or datatrove's (data/datatrove_minhash.h: FineWeb's dedup
// reproduced, with no similarity check).
enum class MinHashScheme { kKeel, kDatatrove };
inline const char* minhash_scheme_name(MinHashScheme s) {
  return s == MinHashScheme::kDatatrove ? "datatrove" : "keel";
}

struct MinHashConfig {
  MinHashScheme scheme = MinHashScheme::kKeel;
  int num_perm = 128;
  int bands = 16;          // rows per band = num_perm / bands
  double threshold = 0.8;  // Jaccard similarity at or above which a document is a near duplicate
  bool char_shingles = false;  // false: word shingles
  int shingle_size = 3;        // words (or characters) per shingle
  uint64_t seed = 1;
};

// The 32-bit words of a document's signature: num_perm, or two per value under datatrove's
// scheme, whose values are 61-bit (low word first).
inline int signature_words(const MinHashConfig& c) {
  return c.scheme == MinHashScheme::kDatatrove ? 2 * c.num_perm : c.num_perm;
}

// The set of shingle hashes of normalised text (sorted, unique). Word shingles are runs of
// `size` consecutive whitespace-separated words; a text with fewer words gives one shingle.
std::vector<uint64_t> shingle_set(std::string_view text, bool char_shingles, int size);
// The same of text normalize_text (text_filters.h) already normalised.
std::vector<uint64_t> shingle_set_of_normalized(std::string_view norm, bool char_shingles,
                                                int size);
// |A ∩ B| / |A ∪ B| of two sorted unique sets (1 when both are empty).
double exact_jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);

class MinHasher {
 public:
  explicit MinHasher(const MinHashConfig& config);
  // (num_perm) minimum of each hash function over the shingles; all-ones for an empty set.
  std::vector<uint32_t> signature(const std::vector<uint64_t>& shingles) const;

 private:
  std::vector<uint64_t> a_, b_;
};

double estimate_jaccard(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);

// Keeps the signatures of accepted documents and answers, for a new one, whether it duplicates
// one of them. Not thread-safe; feed documents in corpus order for deterministic results.
class NearDuplicateIndex {
 public:
  explicit NearDuplicateIndex(const MinHashConfig& config);
  // The id of an indexed document with estimated Jaccard >= threshold, or -1. Does not insert.
  int64_t find(const std::vector<uint32_t>& signature) const;
  void insert(int64_t id, std::vector<uint32_t> signature);
  int64_t candidates_checked() const { return checked_; }

 private:
  uint64_t band_key(const std::vector<uint32_t>& sig, int band) const;
  MinHashConfig config_;
  int rows_;
  std::vector<std::unordered_map<uint64_t, std::vector<int64_t>>> tables_;  // one per band
  std::unordered_map<int64_t, std::vector<uint32_t>> signatures_;
  mutable int64_t checked_ = 0;
};

}  // namespace keel::data
