// The two stages of `keel prepare` on their own: pass 1's decisions per document (repetition,
// exact and near duplicates, in corpus order for any thread count) and pass 2's packing (splits,
// keep-whole window starts, clusters), on small planted corpora.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "data/prepare_passes.h"
#include "data/shard_reader.h"
#include "data_test_util.h"

namespace keel::data {
namespace {

using keel::testing::ScratchDir;

// `docs` as one text file, separated by "%" lines.
std::vector<InputFile> corpus(const ScratchDir& dir, const std::vector<std::string>& docs) {
  std::string text;
  for (const auto& d : docs) text += d + "\n%\n";
  testing::write_text(dir / "corpus.txt", text);
  return {InputFile{dir / "corpus.txt", false}};
}

PrepareOptions options(const ScratchDir& dir) {
  PrepareOptions o;
  o.input.separator = "%";
  o.output = dir / "out";
  o.seq_len = 64;
  return o;
}

TEST(DedupPass, DecidesEveryDocumentInCorpusOrder) {
  ScratchDir dir("dedup_pass");
  std::mt19937_64 rng(5);
  auto base = testing::random_words(rng, 120);
  std::vector<std::string> docs = testing::distinct_docs(20, 3);
  docs.push_back(docs[4]);                                       // 20: exact duplicate of 4
  docs.push_back(testing::join(testing::mutate(base, 0, rng)));  // 21: kept
  docs.push_back(testing::join(testing::mutate(base, 2, rng)));  // 22: near duplicate of 21
  docs.push_back(std::string(400, 'a'));                         // 23: one character
  std::string loop;
  for (int i = 0; i < 20; ++i) loop += "the same sentence over and over again. ";
  docs.push_back(loop);  // 24: repeated spans
  auto o = options(dir);
  o.repetition.max_repeated_share = 0.4;
  o.repetition.max_top_char_share = 0.5;
  const auto files = corpus(dir, docs);
  std::filesystem::create_directories(o.output);  // pass 1 writes the provenance there

  const DedupResult r = dedup_pass(o, files, 1, "");
  ASSERT_EQ(r.status.size(), docs.size());
  EXPECT_EQ(r.status[20], kExactDup);
  EXPECT_EQ(r.status[21], kKept);
  EXPECT_EQ(r.status[22], kNearDup);
  EXPECT_EQ(r.status[23], kOneChar);
  EXPECT_EQ(r.status[24], kRepeated);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(r.status[i], kKept) << i;
  EXPECT_EQ(r.exact_dups, 1);
  EXPECT_EQ(r.near_dups, 1);
  EXPECT_EQ(r.one_char + r.repeated, 2);
  EXPECT_EQ(r.kept_lengths().size(), 21u);
  EXPECT_EQ(r.file_first[0], 0);
  EXPECT_EQ(r.file_docs[0], static_cast<int64_t>(docs.size()));

  const DedupResult threaded = dedup_pass(o, files, 3, "");  // the same decisions
  EXPECT_EQ(threaded.status, r.status);
  EXPECT_EQ(threaded.lengths, r.lengths);
  EXPECT_EQ(threaded.clusters, r.clusters);
  ASSERT_EQ(r.clusters.size(), docs.size());
  EXPECT_EQ(r.clusters[20], r.clusters[4]);  // an exact duplicate has the same MinHash signature
  EXPECT_EQ(r.sources["index"]["records"], docs.size());
}

// `n` words of letters alone: datatrove's simplify_text makes every number 0.
std::vector<std::string> letter_words(std::mt19937_64& rng, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string w;
    for (uint64_t v = 26 * 26 + rng() % (26 * 26 * 26); v > 0; v /= 26) w += char('a' + v % 26);
    out.push_back(w);
  }
  return out;
}

// Under datatrove's scheme the near duplicates are decided after the last document, and the
// SentencePiece sample, taken while reading, is written again without them.
TEST(DedupPass, DatatrovesSchemeDecidesAtTheEndAndTheSampleKeepsNoRemovedDocument) {
  ScratchDir dir("dedup_pass_datatrove");
  std::mt19937_64 rng(6);
  const auto base = letter_words(rng, 120);
  std::vector<std::string> docs;
  for (int i = 0; i < 10; ++i) docs.push_back(testing::join(letter_words(rng, 60)));
  docs.push_back(testing::join(base));  // 10: kept
  std::vector<std::string> changed = base;
  changed[60] = "changed";
  std::string near = testing::join(changed);
  near += " nearcopymarker";
  docs.push_back(near);  // 11: near duplicate of 10
  auto o = options(dir);
  o.minhash.scheme = MinHashScheme::kDatatrove;
  o.minhash.shingle_size = 5;
  o.minhash.num_perm = 112;
  o.minhash.bands = 14;
  const auto files = corpus(dir, docs);
  std::filesystem::create_directories(o.output);
  const std::string sample = dir / "sample.txt";

  const DedupResult r = dedup_pass(o, files, 2, sample);
  ASSERT_EQ(r.status.size(), docs.size());
  EXPECT_EQ(r.status[10], kKept);
  EXPECT_EQ(r.status[11], kNearDup);
  EXPECT_EQ(r.near_dups, 1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(r.status[i], kKept) << i;
  std::ifstream in(sample, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.size(), r.spm_bytes);
  EXPECT_EQ(text.find("nearcopymarker"), std::string::npos);
  EXPECT_NE(text.find(docs[10].substr(0, 40)), std::string::npos);
}

TEST(PackPass, SplitsAndKeepsWholeDocumentsOnWindowBoundaries) {
  ScratchDir dir("pack_pass");
  const auto docs = testing::distinct_docs(200, 9);
  auto o = options(dir);
  o.val_fraction = 0.1;
  o.keep_whole = 1.0;  // every document that fits a window starts on a boundary
  o.seq_len = 300;     // 40..80 words of 5-6 bytes: some fit a window, some do not
  const auto files = corpus(dir, docs);
  std::filesystem::create_directories(o.output);
  const DedupResult dedup = dedup_pass(o, files, 2, "");
  const LengthFilter filter(o.length, dedup.kept_lengths());
  const auto tokenizer = make_byte_tokenizer();
  const PackResult r = pack_pass(o, files, dedup, filter, *tokenizer, 2);

  EXPECT_EQ(r.docs_out, 200);
  const int64_t train = r.splits["train"]["documents"].get<int64_t>();
  const int64_t val = r.splits["val"]["documents"].get<int64_t>();
  EXPECT_EQ(train + val, 200);
  EXPECT_GT(val, 5);
  EXPECT_LT(val, 40);
  EXPECT_GT(r.long_docs, 0);
  EXPECT_GT(r.whole_docs, 0);  // the short ones start on a window boundary
  EXPECT_EQ(r.whole_docs + r.long_docs, 200);
  // Shards written without meta.json yet: the writer's summary names them.
  EXPECT_FALSE(r.splits["train"]["shards"].empty());
}

}  // namespace
}  // namespace keel::data
