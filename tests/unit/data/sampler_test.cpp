// The data order: every epoch is a set of distinct windows, deterministic from the seed, the same
// whatever the micro-batch size, and stratified micro-batches span at least min_clusters buckets
// wherever they start.
#include "data/sampler.h"

#include <gtest/gtest.h>

#include <set>

namespace keel::data {
namespace {

std::vector<uint32_t> skewed_buckets(int64_t n, int64_t buckets) {
  std::vector<uint32_t> b(n);
  for (int64_t w = 0; w < n; ++w) b[w] = static_cast<uint32_t>((w * w + w / 3) % buckets);
  return b;
}

TEST(SampleOrder, EpochsAreDistinctWindowsDeterministicFromSeed) {
  using config::Sampling;
  for (Sampling kind : {Sampling::kSequential, Sampling::kRandom, Sampling::kStratified}) {
    SamplerConfig c{kind, 5, 4, 8, 3};
    SampleOrder a(c, skewed_buckets(203, 8)), b(c, skewed_buckets(203, 8));
    int64_t E = a.epoch_length();
    ASSERT_GT(E, 150) << config::name_of(kind);
    // Another micro-batch size (another layout of the same run) gives the very same order.
    SamplerConfig other = c;
    other.micro_batch = 7;
    SampleOrder e(other, skewed_buckets(203, 8));
    ASSERT_EQ(e.epoch_length(), E) << config::name_of(kind);
    for (int64_t g = 0; g < 3 * E; ++g) ASSERT_EQ(e.at(g), a.at(g)) << config::name_of(kind);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::set<int64_t> seen;
      for (int64_t i = 0; i < E; ++i) {
        int64_t w = a.at(epoch * E + i);
        EXPECT_TRUE(seen.insert(w).second)
            << config::name_of(kind) << ": window " << w << " twice in an epoch";
        EXPECT_EQ(w, b.at(epoch * E + i));
      }
    }
    if (kind == Sampling::kSequential) EXPECT_EQ(a.at(E + 7), 7);
    // A different seed gives a different order (except sequential).
    SamplerConfig c2 = c;
    c2.seed = 6;
    SampleOrder d(c2, skewed_buckets(203, 8));
    int same = 0;
    for (int64_t i = 0; i < 40; ++i) same += d.at(i) == a.at(i);
    if (kind != Sampling::kSequential) EXPECT_LT(same, 20) << config::name_of(kind);
    // Random access back into an earlier epoch agrees with sequential access.
    EXPECT_EQ(a.at(5), b.at(5));
  }
}

TEST(SampleOrder, StratifiedMicroBatchesSpanMinClustersWhereverTheyStart) {
  const int64_t buckets = 6, min_clusters = 4;
  SamplerConfig c{config::Sampling::kStratified, 9, 8, buckets, min_clusters};
  auto bucket = skewed_buckets(1000, buckets);
  SampleOrder order(c, bucket);
  int64_t E = order.epoch_length();
  EXPECT_GT(E, 900);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    for (int64_t g = epoch * E; g + min_clusters <= (epoch + 1) * E; ++g) {
      std::set<uint32_t> spanned;
      for (int64_t i = 0; i < min_clusters; ++i) spanned.insert(bucket[order.at(g + i)]);
      ASSERT_EQ(static_cast<int64_t>(spanned.size()), min_clusters) << "positions from " << g;
    }
  }
}

TEST(SampleOrder, StratifiedWithOneDominantBucketStillHoldsTheConstraint) {
  std::vector<uint32_t> bucket(400, 0);
  for (int i = 0; i < 60; ++i) bucket[i * 5] = 1 + i % 3;  // 60 windows outside bucket 0
  SamplerConfig c{config::Sampling::kStratified, 1, 4, 4, 2};
  SampleOrder order(c, bucket);
  int64_t E = order.epoch_length();
  EXPECT_GE(E, 100);  // 60 minority windows pair with 60 of bucket 0, at least
  EXPECT_LT(E, 400);
  for (int64_t g = 0; g + 2 <= E; ++g)
    EXPECT_NE(bucket[order.at(g)], bucket[order.at(g + 1)]) << "positions " << g << ", " << g + 1;
}

// Every stretch of an epoch mixes the clusters as the whole epoch does: a small cluster is not
// held back until the large ones have drained (the data would shift half-way through the epoch).
TEST(SampleOrder, StratifiedMixesEveryClusterFromTheStartOfTheEpoch) {
  std::vector<uint32_t> bucket;
  for (uint32_t b = 0; b < 4; ++b) bucket.insert(bucket.end(), 400 - 100 * b, b);  // 400 ... 100
  SamplerConfig c{config::Sampling::kStratified, 3, 8, 4, 2};
  SampleOrder order(c, bucket);
  ASSERT_EQ(order.epoch_length(), 1000);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    for (int64_t part = 0; part < 5; ++part) {  // each fifth of the epoch
      std::vector<int> count(4, 0);
      for (int64_t i = 0; i < 200; ++i) ++count[bucket[order.at(epoch * 1000 + part * 200 + i)]];
      for (uint32_t b = 0; b < 4; ++b)  // expected 80, 60, 40, 20
        EXPECT_NEAR(count[b], (400 - 100 * b) / 5, 25) << "epoch " << epoch << " part " << part;
    }
  }
}

}  // namespace
}  // namespace keel::data
