// The shard loader: batches hold the windows their ids name, ranks split the global order,
// resume continues the identical sequence, backpressure waits through a loader_stall without
// repeating a sample, a stall past the timeout stops the run, drop_samples shows in
// samples_served, and a corrupt shard is refused.
#include "data/loader.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "common/error.h"
#include "data_test_util.h"

namespace keel::data {
namespace {

using keel::testing::ScratchDir;

class LoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir("loader");
    PrepareOptions o;
    o.seq_len = 16;
    o.cluster = ClusterBy::kHash;
    testing::prepare_docs(*dir_, testing::distinct_docs(120, 4), o);
  }
  static void TearDownTestSuite() { delete dir_; }

  LoaderOptions options(const std::string& sampler = "stratified", int rank = 0, int world = 1) {
    LoaderOptions o;
    o.dir = *dir_ / "out";
    o.seq_len = 16;
    o.rank = rank;
    o.world_size = world;
    o.sampler = {*config::parse_choice<config::Sampling>(sampler), 42, 4, 8, 3};
    o.loader.queue_capacity = 6;
    o.loader.low_watermark = 2;
    o.loader.high_watermark = 4;
    o.loader.stall_timeout_s = 5;
    return o;
  }
  static ScratchDir* dir_;
};
ScratchDir* LoaderTest::dir_ = nullptr;

std::vector<int64_t> ids_of(const Batch& b) {
  auto t = b.sample_ids;
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

TEST_F(LoaderTest, BatchesHoldTheWindowsTheirIdsName) {
  ShardLoader loader(options());
  auto batch = loader.next();
  ASSERT_EQ(batch.tokens.sizes(), (std::vector<int64_t>{4, 17}));
  ASSERT_EQ(batch.tokens.dtype(), torch::kInt64);
  auto ids = ids_of(batch);
  std::vector<int64_t> expect(17);
  for (int b = 0; b < 4; ++b) {
    loader.shards().read(ids[b] * 16, 17, expect.data());
    for (int t = 0; t < 17; ++t) EXPECT_EQ(batch.tokens[b][t].item<int64_t>(), expect[t]);
  }
  EXPECT_EQ(loader.samples_served(), 4);
  auto text = loader.decode(batch.tokens[0]);
  EXPECT_EQ(text.size() >= 17u, true);
  // Stratified: each micro-batch spans >= 3 buckets.
  for (int i = 0; i < 20; ++i) {
    std::set<uint32_t> buckets;
    for (auto id : ids_of(loader.next())) buckets.insert(loader.bucket_of(id));
    EXPECT_GE(buckets.size(), 3u);
  }
}

TEST_F(LoaderTest, RanksReadDisjointPartsOfTheSingleRankOrder) {
  ShardLoader single(options("random"));
  ShardLoader r0(options("random", 0, 2)), r1(options("random", 1, 2));
  for (int k = 0; k < 10; ++k) {
    auto a = ids_of(r0.next()), b = ids_of(r1.next());
    EXPECT_EQ(a, ids_of(single.next()));
    EXPECT_EQ(b, ids_of(single.next()));
  }
}

TEST_F(LoaderTest, ResumeContinuesTheIdenticalSampleSequence) {
  ShardLoader original(options());
  for (int i = 0; i < 7; ++i) original.next();
  auto saved = nlohmann::json::parse(original.state().dump());  // through text, as a checkpoint
  std::vector<std::vector<int64_t>> expected;
  std::vector<torch::Tensor> expected_tokens;
  for (int i = 0; i < 40; ++i) {  // crosses an epoch boundary
    auto b = original.next();
    expected.push_back(ids_of(b));
    expected_tokens.push_back(b.tokens);
  }
  ShardLoader resumed(options());
  resumed.next();  // a loader that already ran, then loads the state
  resumed.load_state(saved);
  EXPECT_EQ(resumed.samples_served(), 28);
  for (int i = 0; i < 40; ++i) {
    auto b = resumed.next();
    ASSERT_EQ(ids_of(b), expected[i]) << "micro-batch " << i << " after resume";
    EXPECT_TRUE(torch::equal(b.tokens, expected_tokens[i]));
  }
}

TEST_F(LoaderTest, LoaderStallWaitsAndRepeatsNoSample) {
  auto o = options("random");
  o.faults = {{config::FaultKind::kLoaderStall, 3, 2, {}, 1.0, 0.3}};
  ShardLoader loader(o);
  int64_t per_epoch = loader.epoch_length() / 4;
  std::set<int64_t> seen;
  double wait_ms = 0;
  int64_t waits = 0;
  for (int64_t k = 0; k < per_epoch; ++k) {
    for (auto id : ids_of(loader.next()))
      EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " twice";
    auto s = loader.take_stats();
    wait_ms += s.wait_ms;
    waits += s.waits;
    EXPECT_LE(s.queue_depth, 6);
  }
  EXPECT_GE(wait_ms, 450.0) << "two stalled steps of 0.3 s";
  EXPECT_GE(waits, 2);
  EXPECT_EQ(loader.samples_served(), per_epoch * 4);
}

TEST_F(LoaderTest, StallPastTheTimeoutStopsTheRun) {
  auto o = options();
  o.faults = {{config::FaultKind::kLoaderStall, 1, 1, {}, 1.0, 30.0}};
  o.loader.stall_timeout_s = 0.3;
  ShardLoader loader(o);
  loader.next();
  try {
    for (int i = 0; i < 10; ++i) loader.next();
    FAIL() << "no RunStopped";
  } catch (const RunStopped& e) {
    EXPECT_NE(std::string(e.what()).find("stall_timeout_s"), std::string::npos) << e.what();
  }
}

TEST_F(LoaderTest, DropSamplesShowsInSamplesServed) {
  auto o = options("sequential");
  o.grad_accum_steps = 2;
  o.faults = {{config::FaultKind::kDropSamples, 2, 1, {}, 0.1, 0.0}};
  ShardLoader loader(o);
  std::set<int64_t> seen;
  const int micro_batches = 24;  // steps 0..11; drops from step 2 on
  for (int k = 0; k < micro_batches; ++k)
    for (auto id : ids_of(loader.next())) EXPECT_TRUE(seen.insert(id).second);
  int64_t expected = micro_batches * 4;
  double deviation = double(loader.samples_served() - expected) / expected;
  EXPECT_GT(deviation, 0.05) << loader.samples_served() << " served vs " << expected;
  EXPECT_LT(deviation, 0.25);
}

TEST_F(LoaderTest, VocabularyLargerThanTheModelIsRefused) {
  auto o = options();
  o.model_vocab_size = 256;
  EXPECT_THROW(ShardLoader{o}, DataError);
}

TEST_F(LoaderTest, CorruptShardIsRefused) {
  ScratchDir copy("loader_corrupt");
  std::filesystem::copy(*dir_ / "out", copy.str(), std::filesystem::copy_options::recursive);
  auto shard = copy / "train_00000.bin";
  auto bytes = testing::read_bytes(shard);
  bytes[bytes.size() / 2] ^= 0x10;
  testing::write_text(shard, bytes);
  auto o = options();
  o.dir = copy.str();
  try {
    ShardLoader loader(o);
    FAIL() << "loaded a corrupt shard";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("train_00000.bin"), std::string::npos) << e.what();
  }
}

TEST_F(LoaderTest, FactoryReadsConfigAndValSplit) {
  config::Config cfg;
  cfg.data.source = config::DataSource::kShards;
  cfg.data.path = *dir_ / "out";
  cfg.model.seq_len = 16;
  cfg.model.vocab_size = 264;
  cfg.data.micro_batch_size = 2;
  auto src = make_shard_source(cfg, 0, 1, false);
  EXPECT_EQ(src->next().tokens.size(0), 2);
  EXPECT_EQ(src->state()["sampler"], "stratified");
  EXPECT_THROW(make_shard_source(cfg, 0, 1, true), DataError);  // prepared without --val-fraction
}

// How fast the loader serves when the trainer takes batches as fast as it can (a floor that any
// trainer step is far slower than; bench/data and docs/benchmarks.md give the measured figure).
TEST_F(LoaderTest, ServesFasterThanATrainerConsumes) {
  auto o = options();
  o.loader.workers = 2;
  ShardLoader loader(o);
  loader.next();
  auto t0 = std::chrono::steady_clock::now();
  const int n = 400;
  for (int i = 0; i < n; ++i) loader.next();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[loader] %.0f micro-batches/s (B=4, T=16, 2 workers)\n", n / s);
  EXPECT_GT(n / s, 200.0);
}

}  // namespace
}  // namespace keel::data
