// The shard format round-trips, and the reader refuses corrupt, truncated and mismatched data with
// a DataError that names the file — including a deterministic replay of corrupted inputs through
// the same entry points the libFuzzer target (tests/fuzz/shard_reader_fuzz.cpp) drives.
#include "data/shard_reader.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "data/shard_writer.h"
#include "data_test_util.h"

namespace keel::data {
namespace {

using keel::testing::ScratchDir;

// A dataset written directly with SplitWriter: docs of known tokens, small shards.
void write_dataset(const std::string& dir, const std::vector<std::vector<uint32_t>>& docs,
                   int64_t shard_tokens) {
  SplitWriter w(dir, "train", 2, 257, 256, shard_tokens);
  for (size_t i = 0; i < docs.size(); ++i)
    w.add_document(docs[i], i * 2, static_cast<uint32_t>(i % 3));
  nlohmann::json meta = {{"format", kMetaFormatName},
                         {"version", kShardFormatVersion},
                         {"vocab_size", 257},
                         {"token_dtype", "uint16"},
                         {"boundary_id", 256},
                         {"seq_len", 8},
                         {"tokenizer", {{"kind", "byte"}}},
                         {"splits", {{"train", w.finish()}}}};
  testing::write_text(dir + "/meta.json", meta.dump());
}

std::vector<std::vector<uint32_t>> sample_docs() {
  std::vector<std::vector<uint32_t>> docs;
  for (uint32_t d = 0; d < 7; ++d) {
    std::vector<uint32_t> t;
    for (uint32_t i = 0; i < 3 + d * 2; ++i) t.push_back((d * 31 + i) % 256);
    docs.push_back(t);
  }
  return docs;
}

TEST(ShardReader, RoundTripsTokensAcrossShardsWithBoundaries) {
  ScratchDir dir("roundtrip");
  auto docs = sample_docs();
  write_dataset(dir.str(), docs, 10);  // several shards; documents straddle them
  auto set = ShardSet::open(dir.str(), "train");
  ASSERT_GT(set->meta().splits.at("train").shards.size(), 3u);
  ASSERT_EQ(set->documents().size(), docs.size());
  std::vector<int64_t> all(set->num_tokens());
  set->read(0, set->num_tokens(), all.data());
  int64_t pos = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const auto& r = set->documents()[d];
    EXPECT_EQ(static_cast<int64_t>(r.offset), pos);
    EXPECT_EQ(r.length, docs[d].size());
    EXPECT_EQ(r.doc_id, d * 2);
    for (size_t i = 0; i < docs[d].size(); ++i) EXPECT_EQ(all[pos + i], docs[d][i]);
    EXPECT_EQ(all[pos + docs[d].size()], 256) << "boundary token after document " << d;
    EXPECT_EQ(set->document_at(pos), static_cast<int64_t>(d));
    EXPECT_EQ(set->document_at(pos + docs[d].size()), static_cast<int64_t>(d));
    pos += docs[d].size() + 1;
  }
  EXPECT_EQ(pos, set->num_tokens());
  EXPECT_EQ(shard_vocab_size(dir.str()), 257);
}

void expect_refused(const std::string& dir, const std::string& file, const std::string& what) {
  try {
    ShardSet::open(dir, "train");
    ADD_FAILURE() << "opened a dataset with " << what;
  } catch (const DataError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT"), std::string::npos) << msg;
  }
}

TEST(ShardReader, RefusesCorruptTruncatedAndMismatchedFiles) {
  ScratchDir dir("corrupt");
  auto docs = sample_docs();
  auto shard = dir / "train_00001.bin";
  auto fresh = [&] {
    testing::remove_tree(dir.str());
    std::filesystem::create_directories(dir.str());
    write_dataset(dir.str(), docs, 10);
  };
  fresh();
  auto bytes = testing::read_bytes(shard);
  bytes[70] ^= 0x01;
  testing::write_text(shard, bytes);
  expect_refused(dir.str(), "train_00001.bin", "checksum mismatch");

  fresh();
  bytes = testing::read_bytes(shard);
  testing::write_text(shard, bytes.substr(0, bytes.size() - 3));
  expect_refused(dir.str(), "train_00001.bin", "truncated");

  fresh();
  testing::write_text(shard, bytes.substr(0, 20));
  expect_refused(dir.str(), "train_00001.bin", "truncated");

  fresh();
  bytes[8] = 9;  // version field
  testing::write_text(shard, bytes);
  expect_refused(dir.str(), "train_00001.bin", "version");

  fresh();  // a shard from another dataset in its place
  std::filesystem::copy_file(dir / "train_00002.bin", shard,
                             std::filesystem::copy_options::overwrite_existing);
  expect_refused(dir.str(), "train_00001.bin", "meta.json");

  fresh();
  std::filesystem::remove(dir / "train.idx");
  expect_refused(dir.str(), "train.idx", "cannot open");

  fresh();
  bytes = testing::read_bytes(dir / "train.idx");
  bytes[64 + 24] ^= 0x40;
  testing::write_text(dir / "train.idx", bytes);
  expect_refused(dir.str(), "train.idx", "checksum");

  fresh();
  std::filesystem::remove(dir / "meta.json");
  expect_refused(dir.str(), "meta.json", "missing");

  fresh();
  testing::write_text(dir / "meta.json", "{\"format\": \"keel-shards\", \"version\": 1, \"vocab");
  expect_refused(dir.str(), "meta.json", "not valid JSON");
}

// Deterministic mutations of valid files: every one must be accepted unchanged or refused with a
// DataError; nothing else may escape (the fuzz target's contract, exercised under g++).
TEST(ShardReader, ReplayOfCorruptedInputsNeverCrashes) {
  ScratchDir dir("replay");
  write_dataset(dir.str(), sample_docs(), 1000);
  auto meta_text = testing::read_bytes(dir / "meta.json");
  auto meta = parse_meta(meta_text, "meta.json");
  const auto& split = meta.splits.at("train");
  auto shard = testing::read_bytes(dir / split.shards[0].file);
  auto index = testing::read_bytes(dir / split.index_file);
  std::mt19937_64 rng(7);
  int refused = 0, accepted = 0;
  auto run = [&](int kind, const std::string& bytes) {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
    try {
      if (kind == 0)
        check_shard_bytes(p, bytes.size(), "shard", split.shards[0], 2, 257);
      else if (kind == 1)
        check_index_bytes(p, bytes.size(), "index", split);
      else
        parse_meta(bytes, "meta.json");
      ++accepted;
    } catch (const DataError&) {
      ++refused;
    }
  };
  const std::string originals[3] = {shard, index, meta_text};
  for (int kind = 0; kind < 3; ++kind) {
    const std::string& orig = originals[kind];
    run(kind, orig);
    ASSERT_EQ(accepted, 1) << "the unmodified file must pass";
    accepted = 0;
    for (size_t len = 0; len < orig.size(); len += 1 + len / 8) run(kind, orig.substr(0, len));
    for (int i = 0; i < 400; ++i) {
      std::string m = orig;
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) m[rng() % m.size()] ^= static_cast<char>(1 + rng() % 255);
      if (rng() % 4 == 0) m += std::string(1 + rng() % 9, static_cast<char>(rng()));
      run(kind, m);
    }
  }
  EXPECT_GT(refused, 1000);
  // parse_meta alone cannot see an edited checksum digit or JSON whitespace; shards and index can.
  EXPECT_LE(accepted, 120) << "almost every corruption must be caught";
}

}  // namespace
}  // namespace keel::data
