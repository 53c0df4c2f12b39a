// Megatron's .bin/.idx and llm.c's .bin shards, written by tests/foreign_writers.h from the
// formats' descriptions, read back as keel's ShardSet: the same stream, documents and clusters; the
// held-out split; and every kind of damage refused with a DataError naming the file (and the byte).
#include "data/foreign_formats.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "foreign_writers.h"
#include "scratch_dir.h"

namespace keel::data {
namespace {

using config::DataSource;
using keel::testing::ScratchDir;
using keel::testing::TokenDocs;
constexpr uint32_t kEnd = 256;

TokenDocs sample_docs(int n) {
  TokenDocs docs;
  for (int d = 0; d < n; ++d) {
    std::vector<uint32_t> t;
    for (int i = 0; i < 5 + (d * 7) % 23; ++i)
      t.push_back(static_cast<uint32_t>((d * 31 + i * 7) % 250));
    docs.push_back(t);
  }
  return docs;
}

std::vector<int64_t> all_tokens(const ShardSet& s) {
  std::vector<int64_t> out(s.num_tokens());
  s.read(0, s.num_tokens(), out.data());
  return out;
}

std::string error_of(const ForeignSource& src) {
  try {
    open_foreign(src);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(MegatronSource, ReadsTheStreamAndDocumentsAsWritten) {
  ScratchDir dir("megatron_read");
  const auto docs = sample_docs(12);
  testing::write_megatron(dir.path() / "corpus_text_document", docs, kEnd);
  for (const std::string path : {"corpus_text_document", "corpus_text_document.idx"}) {
    auto set = open_foreign({DataSource::kMegatron, dir / path, "train", 0.0, 264});
    std::vector<int64_t> want;
    for (const auto& d : docs) {
      want.insert(want.end(), d.begin(), d.end());
      want.push_back(kEnd);
    }
    EXPECT_EQ(all_tokens(*set), want);
    ASSERT_EQ(set->documents().size(), docs.size());
    uint64_t offset = 0;
    for (size_t k = 0; k < docs.size(); ++k) {
      const auto& r = set->documents()[k];
      EXPECT_EQ(r.offset, offset);
      EXPECT_EQ(r.length, docs[k].size());
      EXPECT_EQ(r.doc_id, k);
      auto with_end = docs[k];
      with_end.push_back(kEnd);
      EXPECT_EQ(r.cluster, testing::foreign_cluster(with_end));
      offset += docs[k].size() + 1;
    }
    EXPECT_EQ(set->meta().boundary_id, kEnd);  // the end token every document shares
    EXPECT_EQ(set->shard_at(3).first, "corpus_text_document.bin");
  }
}

TEST(MegatronSource, Int32TokensGiveTheSameStreamAndClusters) {
  ScratchDir dir("megatron_int32");
  const auto docs = sample_docs(9);
  testing::write_megatron(dir.path() / "a", docs, kEnd, /*int32=*/false);
  testing::write_megatron(dir.path() / "b", docs, kEnd, /*int32=*/true);
  auto a = open_foreign({DataSource::kMegatron, dir / "a", "train", 0.0, 264});
  auto b = open_foreign({DataSource::kMegatron, dir / "b", "train", 0.0, 264});
  EXPECT_EQ(b->meta().token_bytes, 4u);
  EXPECT_EQ(all_tokens(*a), all_tokens(*b));
  for (size_t k = 0; k < docs.size(); ++k)
    EXPECT_EQ(a->documents()[k].cluster, b->documents()[k].cluster);
}

TEST(MegatronSource, HoldsOutTheLastDocumentsForValidation) {
  ScratchDir dir("megatron_holdout");
  const auto docs = sample_docs(100);
  testing::write_megatron(dir.path() / "c", docs, kEnd);
  auto train = open_foreign({DataSource::kMegatron, dir / "c", "train", 0.02, 264});
  auto val = open_foreign({DataSource::kMegatron, dir / "c", "val", 0.02, 264});
  auto whole = open_foreign({DataSource::kMegatron, dir / "c", "train", 0.0, 264});
  ASSERT_EQ(train->documents().size(), 98u);
  ASSERT_EQ(val->documents().size(), 2u);
  EXPECT_EQ(val->documents()[0].doc_id, 98u);
  EXPECT_EQ(val->documents()[0].offset, 0u);  // offsets are the split's own
  EXPECT_EQ(train->num_tokens() + val->num_tokens(), whole->num_tokens());
  auto t = all_tokens(*train), v = all_tokens(*val);
  t.insert(t.end(), v.begin(), v.end());
  EXPECT_EQ(t, all_tokens(*whole));
  // One document cannot be split in two.
  testing::write_megatron(dir.path() / "one", sample_docs(1), kEnd);
  EXPECT_NE(
      error_of({DataSource::kMegatron, dir / "one", "train", 0.02, 264}).find("data.val_path"),
      std::string::npos);
}

TEST(MegatronSource, RefusesDamageNamingTheFileAndByte) {
  ScratchDir dir("megatron_damage");
  const auto docs = sample_docs(6);
  auto fresh = [&] { testing::write_megatron(dir.path() / "d", docs, kEnd); };
  auto damaged = [&](const std::string& file, size_t byte) {
    fresh();
    testing::flip_byte(dir.path() / file, byte);
    return error_of({DataSource::kMegatron, dir / "d", "train", 0.0, 264});
  };
  const size_t sizes = 34, pointers = sizes + 6 * 4, doc_index = pointers + 6 * 8;
  EXPECT_NE(damaged("d.idx", 0).find("d.idx: byte 0: not a Megatron MMIDIDX index"),
            std::string::npos);
  EXPECT_NE(damaged("d.idx", 9).find("byte 9: index version"), std::string::npos);
  EXPECT_NE(damaged("d.idx", 17).find("byte 17: token dtype code"), std::string::npos);
  EXPECT_NE(damaged("d.idx", 18).find("do not match the file's"), std::string::npos);
  EXPECT_NE(damaged("d.idx", sizes + 4).find("d.idx: byte"), std::string::npos);  // a size
  EXPECT_NE(damaged("d.idx", pointers + 8 * 2).find("points at byte"), std::string::npos);
  EXPECT_NE(damaged("d.idx", doc_index + 8 * 3).find("document index entry 3"), std::string::npos);
  // A token's high byte: the id leaves the vocabulary, named by file and token offset.
  EXPECT_NE(damaged("d.bin", 2 * 3 + 1).find("d.bin: token 3 is id"), std::string::npos);
  fresh();
  std::filesystem::resize_file(dir.path() / "d.bin", 10);
  EXPECT_NE(error_of({DataSource::kMegatron, dir / "d", "train", 0.0, 264}).find("d.bin: 10 bytes"),
            std::string::npos);
  fresh();
  EXPECT_NE(
      error_of({DataSource::kMegatron, dir / "missing", "train", 0.0, 264}).find("missing.idx"),
      std::string::npos);
}

TEST(LlmcSource, ReadsShardsAsOneStreamWithDocumentsAcrossThem) {
  ScratchDir dir("llmc_read");
  const auto docs = sample_docs(20);
  std::vector<std::filesystem::path> files = {dir.path() / "fw_train_000000.bin",
                                              dir.path() / "fw_train_000001.bin",
                                              dir.path() / "fw_train_000002.bin"};
  testing::write_llmc(files, docs, kEnd);
  std::vector<int64_t> want;
  for (const auto& d : docs) {
    want.push_back(kEnd);
    want.insert(want.end(), d.begin(), d.end());
  }
  want.push_back(kEnd);
  for (const std::string path : {dir.str(), dir / "fw_train_*.bin"}) {
    auto set = open_foreign({DataSource::kLlmc, path, "train", 0.0, 264});
    EXPECT_EQ(all_tokens(*set), want);
    ASSERT_EQ(set->documents().size(), docs.size());  // the trailing delimiter opens nothing
    uint64_t offset = 1;
    for (size_t k = 0; k < docs.size(); ++k) {
      const auto& r = set->documents()[k];
      EXPECT_EQ(r.offset, offset);
      EXPECT_EQ(r.length, docs[k].size());
      EXPECT_EQ(r.cluster, testing::foreign_cluster(docs[k]));
      offset += docs[k].size() + 1;
    }
    EXPECT_EQ(set->meta().boundary_id, kEnd);
    EXPECT_EQ(set->shard_at(static_cast<int64_t>(want.size()) - 1).first, "fw_train_000002.bin");
  }
  // uint32 shards (llm.c's Llama-3 header) read the same.
  ScratchDir wide("llmc_u32");
  testing::write_llmc({wide.path() / "a.bin"}, docs, kEnd, /*uint32=*/true);
  EXPECT_EQ(all_tokens(*open_foreign({DataSource::kLlmc, wide / "a.bin", "train", 0.0, 264})),
            want);
}

TEST(LlmcSource, RefusesDamageAndMixedShards) {
  ScratchDir dir("llmc_damage");
  const auto docs = sample_docs(8);
  auto fresh = [&] { testing::write_llmc({dir.path() / "s.bin"}, docs, kEnd); };
  auto damaged = [&](size_t byte) {
    fresh();
    testing::flip_byte(dir.path() / "s.bin", byte);
    return error_of({DataSource::kLlmc, dir / "s.bin", "train", 0.0, 264});
  };
  EXPECT_NE(damaged(0).find("s.bin: byte 0: magic"), std::string::npos);
  EXPECT_NE(damaged(4).find("s.bin: byte 0: magic"), std::string::npos);  // the version
  EXPECT_NE(damaged(8).find("s.bin: byte 8: the header says"), std::string::npos);
  EXPECT_NE(damaged(1024 + 2 * 5 + 1).find("s.bin: token 5 is id"), std::string::npos);
  EXPECT_NE(error_of({DataSource::kLlmc, dir / "none_*.bin", "train", 0.0, 264})
                .find("matches no llm.c .bin shard"),
            std::string::npos);
  fresh();
  testing::write_llmc({dir.path() / "t.bin"}, docs, kEnd, /*uint32=*/true);
  EXPECT_NE(error_of({DataSource::kLlmc, dir.str(), "train", 0.0, 264}).find("4-byte tokens"),
            std::string::npos);
  // Pre-tokenized data names no vocabulary: the model's must be given.
  EXPECT_THROW(open_foreign({DataSource::kLlmc, dir / "s.bin", "train", 0.0, 0}), ConfigError);
}

// A dataset `keel prepare` wrote, given to either reader: named as what it is, with the source
// that reads it (it failed on a missing .idx, or on "magic 1279608139", which is "KEEL").
TEST(ForeignSource, AKeelDatasetIsNamedWithTheSourceThatReadsIt) {
  ScratchDir dir("foreign_keel_dataset");
  std::ofstream(dir.path() / "meta.json") << "{}";
  testing::write_llmc({dir.path() / "train_00000.bin"}, sample_docs(8), kEnd);
  for (const auto& [format, path] :
       std::vector<std::pair<DataSource, std::string>>{{DataSource::kMegatron, dir.str()},
                                                       {DataSource::kLlmc, dir.str()},
                                                       {DataSource::kLlmc, dir / "*.bin"}}) {
    const std::string error = error_of({format, path, "train", 0.0, 264});
    EXPECT_NE(error.find("a dataset `keel prepare` wrote"), std::string::npos) << error;
    EXPECT_NE(error.find("set data.source: shards"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace keel::data
