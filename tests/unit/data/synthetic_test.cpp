#include "data/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "common/error.h"

namespace keel::data {
namespace {

TEST(SyntheticChain, EntropyRateIsZipfEntropy) {
  SyntheticChain chain(256, 8, 1.0, 7);
  // Hand-computed: p_j = (1/(j+1)) / H_8 for j < 8.
  double h8 = 0;
  for (int j = 1; j <= 8; ++j) h8 += 1.0 / j;
  double expected = 0;
  for (int j = 1; j <= 8; ++j) expected -= (1.0 / j / h8) * std::log(1.0 / j / h8);
  EXPECT_NEAR(chain.entropy_rate(), expected, 1e-12);
  EXPECT_NEAR(chain.entropy_rate(), 1.8158479, 1e-6);
}

TEST(SyntheticChain, DeterministicPerSampleId) {
  SyntheticChain a(64, 4, 1.0, 3), b(64, 4, 1.0, 3), c(64, 4, 1.0, 4);
  std::vector<int64_t> x(50), y(50), z(50);
  a.generate(12345, 50, x.data());
  b.generate(12345, 50, y.data());
  c.generate(12345, 50, z.data());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  a.generate(12346, 50, z.data());
  EXPECT_NE(x, z);
}

// The empirical conditional entropy of successors matches the analytic rate, and each token has
// exactly `branching` successors: the floor is what the data really holds.
TEST(SyntheticChain, EmpiricalConditionalEntropyMatches) {
  const int64_t V = 32, K = 4, L = 2000;
  SyntheticChain chain(V, K, 1.0, 11);
  std::map<std::pair<int64_t, int64_t>, int64_t> pair_counts;
  std::map<int64_t, int64_t> counts;
  std::vector<int64_t> seq(L);
  for (int64_t s = 0; s < 100; ++s) {
    chain.generate(s, L, seq.data());
    for (int64_t t = 0; t + 1 < L; ++t) {
      ++pair_counts[{seq[t], seq[t + 1]}];
      ++counts[seq[t]];
    }
  }
  std::map<int64_t, std::set<int64_t>> successors;
  double total = 0, h = 0;
  for (auto& [pair, n] : pair_counts) {
    successors[pair.first].insert(pair.second);
    double p = static_cast<double>(n) / counts[pair.first];
    h -= n * std::log(p);
    total += n;
  }
  for (auto& [tok, succ] : successors) EXPECT_EQ(succ.size(), static_cast<size_t>(K)) << tok;
  EXPECT_NEAR(h / total, chain.entropy_rate(), 0.01);
  // Uniform stationary distribution: every token appears about equally often.
  for (auto& [tok, n] : counts) EXPECT_NEAR(static_cast<double>(n) / total, 1.0 / V, 0.2 / V);
}

TEST(SyntheticSource, RanksReadDisjointSlicesOfOneGlobalOrder) {
  auto make = [](int rank, int world) {
    return SyntheticSource(SyntheticChain(64, 4, 1.0, 5), 4, 16, rank, world);
  };
  SyntheticSource single = make(0, 1);
  SyntheticSource r0 = make(0, 2), r1 = make(1, 2);
  std::vector<int64_t> global, ranked;
  for (int i = 0; i < 4; ++i) {
    auto ids = single.next().sample_ids;
    global.insert(global.end(), ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 4);
  }
  for (int i = 0; i < 2; ++i) {
    for (auto* src : {&r0, &r1}) {
      auto ids = src->next().sample_ids;
      ranked.insert(ranked.end(), ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 4);
    }
  }
  EXPECT_EQ(global, ranked);
}

TEST(SyntheticSource, ResumeFromStateContinuesTheSameSamples) {
  SyntheticSource a(SyntheticChain(64, 4, 1.0, 5), 4, 16, 0, 1);
  a.next();
  a.next();
  auto state = a.state();
  auto expected = a.next();
  SyntheticSource b(SyntheticChain(64, 4, 1.0, 5), 4, 16, 0, 1);
  b.load_state(state);
  auto got = b.next();
  EXPECT_TRUE(torch::equal(expected.tokens, got.tokens));
  EXPECT_TRUE(torch::equal(expected.sample_ids, got.sample_ids));
  EXPECT_EQ(b.samples_served(), 12);
}

// Saved by 2 ranks of micro-batch 4 after 3 global micro-batches (24 samples): one rank of 8
// continues at sample 24, as the 2 ranks would have; one of 16 cannot (24 is not a multiple).
TEST(SyntheticSource, ResumeAtAnotherWorldSizeContinuesTheGlobalOrder) {
  auto make = [](int64_t micro, int rank, int world) {
    return SyntheticSource(SyntheticChain(64, 4, 1.0, 5), micro, 16, rank, world);
  };
  SyntheticSource r0 = make(4, 0, 2);
  for (int i = 0; i < 3; ++i) r0.next();
  SyntheticSource one = make(8, 0, 1);
  one.load_state(r0.state());
  EXPECT_EQ(one.samples_served(), 24);
  auto ids = one.next().sample_ids;
  EXPECT_EQ(ids[0].item<int64_t>(), 24);
  EXPECT_EQ(ids[7].item<int64_t>(), 31);
  SyntheticSource sixteen = make(16, 0, 1);
  EXPECT_THROW(sixteen.load_state(r0.state()), DataError);
}

}  // namespace
}  // namespace keel::data
