// Near-duplicate detection against exact Jaccard on a corpus with planted near duplicates:
// recall >= 0.95 for pairs at Jaccard >= 0.85, false positives <= 1 % below 0.6.
#include "data/minhash.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "data/text_filters.h"
#include "data_test_util.h"

namespace keel::data {
namespace {

TEST(Shingles, WordAndCharShinglesOfNormalisedText) {
  EXPECT_EQ(shingle_set("a b c d", false, 3).size(), 2u);
  EXPECT_EQ(shingle_set("A  b\n C d", false, 3), shingle_set("a b c d", false, 3));
  EXPECT_EQ(shingle_set("a b", false, 3).size(), 1u);  // shorter than one shingle: one shingle
  EXPECT_TRUE(shingle_set("  ", false, 3).empty());
  EXPECT_EQ(shingle_set("abcdef", true, 5).size(), 2u);
  EXPECT_DOUBLE_EQ(
      exact_jaccard(shingle_set("a b c d e", false, 1), shingle_set("a b c d f", false, 1)),
      4.0 / 6.0);
  EXPECT_EQ(normalize_text("  Hello\tWORLD \n"), "hello world");
}

TEST(MinHash, EstimatesJaccard) {
  MinHashConfig c;
  c.num_perm = 256;
  MinHasher h(c);
  std::mt19937_64 rng(3);
  auto a = testing::random_words(rng, 300);
  auto b = testing::mutate(a, 30, rng);
  auto sa = shingle_set(testing::join(a), false, 3), sb = shingle_set(testing::join(b), false, 3);
  double exact = exact_jaccard(sa, sb);
  EXPECT_NEAR(estimate_jaccard(h.signature(sa), h.signature(sb)), exact, 0.08);
}

struct Pair {
  double jaccard;
  bool flagged;
};

// Plants pairs (base, edited copy) over a range of similarities among unrelated documents; feeds
// the corpus in order and records, for each planted copy, whether it was flagged as a near
// duplicate of anything, next to its exact Jaccard with its base.
TEST(MinHash, PlantedNearDuplicatesRecallAndFalsePositives) {
  MinHashConfig config;  // defaults: 128 perms, 16 bands, threshold 0.8, word 3-shingles
  MinHasher hasher(config);
  NearDuplicateIndex index(config);
  std::mt19937_64 rng(11);
  std::vector<Pair> pairs;
  int64_t id = 0, unrelated_flagged = 0, unrelated = 0;
  for (int i = 0; i < 1200; ++i) {
    auto base = testing::random_words(rng, 150 + static_cast<int>(rng() % 100));
    auto sb = shingle_set(testing::join(base), false, 3);
    auto sig = hasher.signature(sb);
    ++unrelated;
    if (index.find(sig) >= 0) ++unrelated_flagged;
    index.insert(id++, sig);
    if (i % 2 == 0) continue;
    // Edit a share of the words: 1..25 % gives Jaccard from ~0.95 down to ~0.4 on 3-shingles.
    int changes = 1 + static_cast<int>(rng() % (base.size() / 4));
    auto copy = testing::mutate(base, changes, rng);
    auto sc = shingle_set(testing::join(copy), false, 3);
    auto csig = hasher.signature(sc);
    pairs.push_back({exact_jaccard(sb, sc), index.find(csig) >= 0});
    index.insert(id++, csig);
  }
  int hi = 0, hi_found = 0, lo = 0, lo_flagged = 0, tp = 0, fp = 0, fn = 0;
  for (const auto& p : pairs) {
    if (p.jaccard >= 0.85) {
      ++hi;
      hi_found += p.flagged;
    }
    if (p.jaccard < 0.6) {
      ++lo;
      lo_flagged += p.flagged;
    }
    bool truth = p.jaccard >= config.threshold;
    tp += truth && p.flagged;
    fp += !truth && p.flagged;
    fn += truth && !p.flagged;
  }
  ASSERT_GT(hi, 50);
  ASSERT_GT(lo, 50);
  double recall = static_cast<double>(hi_found) / hi;
  double fp_rate = static_cast<double>(lo_flagged) / lo;
  std::printf(
      "[minhash] recall@J>=0.85 %.3f (%d pairs), false positives@J<0.6 %.4f (%d pairs), "
      "precision@0.8 %.3f recall@0.8 %.3f, unrelated flagged %lld/%lld\n",
      recall, hi, fp_rate, lo, tp + fp ? double(tp) / (tp + fp) : 1.0,
      tp + fn ? double(tp) / (tp + fn) : 1.0, static_cast<long long>(unrelated_flagged),
      static_cast<long long>(unrelated));
  EXPECT_GE(recall, 0.95);
  EXPECT_LE(fp_rate, 0.01);
  EXPECT_LE(unrelated_flagged, unrelated / 100);
}

TEST(LengthFilter, RemovesExactlyThePlantedOutliers) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < 100; ++i) lengths.push_back(100 + i);  // normal documents
  lengths.push_back(0);                                      // below min
  lengths.push_back(5000);                                   // above max
  LengthRules rules{10, 1000, 0.0};
  LengthFilter hard(rules, lengths);
  EXPECT_EQ(hard.removed(), 2);
  EXPECT_FALSE(hard.keep(0));
  EXPECT_FALSE(hard.keep(5000));
  EXPECT_TRUE(hard.keep(100));
  EXPECT_TRUE(hard.keep(199));
  rules.drop_percentile_tails = 2.0;  // of the 100 that pass: 2 shortest, 2 longest
  LengthFilter tails(rules, lengths);
  EXPECT_EQ(tails.removed(), 6);
  EXPECT_FALSE(tails.keep(101));
  EXPECT_TRUE(tails.keep(102));
  EXPECT_TRUE(tails.keep(197));
  EXPECT_FALSE(tails.keep(198));
  auto r = tails.report();
  EXPECT_EQ(r["removed"]["below_min"], 1);
  EXPECT_EQ(r["removed"]["above_max"], 1);
  EXPECT_EQ(r["removed"]["low_tail"], 2);
  EXPECT_EQ(r["removed"]["high_tail"], 2);
  int64_t total = 0;
  for (const auto& b : r["histogram"]) total += b["documents"].get<int64_t>();
  EXPECT_EQ(total, 102);
}

}  // namespace
}  // namespace keel::data
