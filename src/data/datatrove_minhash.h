// datatrove's MinHash near dedup, the pipeline FineWeb was deduplicated with, reproduced decision
// for decision (`keel prepare --minhash-scheme datatrove`; datatrove 0.6.0,
// datatrove/pipeline/dedup/minhash.py):
//   - the text is simplified (datatrove.utils.text.simplify_text with its default TextNormConfig);
//   - its words (spaCy's English tokenizer) give n-grams joined by one space, each hashed with
//     xxh64;
//   - each hash function is (a·x + b mod 2^64) mod (2^61 − 1), its a and b drawn by numpy's legacy
//     RandomState(seed).randint (MT19937; masked rejection), the signature the minimum per
//     function;
//   - stage 2: per bucket (band), the documents sorted by the band's values then by id, and each
//     pair of neighbours with equal values a duplicate pair;
//   - stage 3: union-find over the pairs in bucket order (union by size, the first root winning a
//     tie); every document of a cluster but its root is removed.
// Unlike keel's own scheme (minhash.h) there is no similarity check: sharing a bucket with another
// document, directly or through a chain of documents, is enough. Words are split as datatrove's
// English word tokenizer, spaCy's, splits them (data/spacy_en_words.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace keel::data {

// simplify_text: lower case (Python's str.lower, final sigma included), every run of decimal
// digits (with one decimal separator inside) to "0", datatrove's punctuation and the control
// characters to spaces, whitespace stripped and its runs made one space, NFD with the nonspacing
// marks (Mn) dropped, stripped again. Bytes that are not UTF-8 are kept as they are. The Unicode
// tables are utf8proc's (Unicode 15), Python 3.11's are Unicode 14: characters assigned in 15
// alone may differ.
std::string datatrove_simplify(std::string_view text);

class DatatroveMinHasher {
 public:
  // `ngrams` words per shingle; `hashes` = buckets × hashes per bucket; `seed` MinhashConfig.seed.
  DatatroveMinHasher(int ngrams, int hashes, uint32_t seed = 1);
  // The xxh64 of every word n-gram of the simplified text, in text order, repeats included; empty
  // when it has fewer than n words.
  std::vector<uint64_t> shingles(std::string_view text) const;
  // (hashes) values below 2^61 − 1; empty when the text has no shingle (datatrove writes no
  // signature for it, so it is never a duplicate).
  std::vector<uint64_t> signature(std::string_view text) const;
  const std::vector<uint64_t>& a() const { return a_; }
  const std::vector<uint64_t>& b() const { return b_; }

 private:
  int ngrams_;
  std::vector<uint64_t> a_, b_;
};

// Stages 2 and 3 over the signatures of a corpus.
class DatatroveClusters {
 public:
  DatatroveClusters(int buckets, int rows);
  // Documents in increasing id order; `signature` has buckets × rows values.
  void add(int64_t doc, std::span<const uint64_t> signature);
  // The documents to remove, in increasing order. Call once, after the last add.
  std::vector<int64_t> removed();
  int64_t pairs() const { return pairs_; }  // duplicate pairs stage 2 found (after removed())

 private:
  int buckets_, rows_;
  std::vector<int64_t> docs_;
  std::vector<uint64_t> values_;  // docs_.size() × buckets × rows
  int64_t pairs_ = 0;
};

}  // namespace keel::data
