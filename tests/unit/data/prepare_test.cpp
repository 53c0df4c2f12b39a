// `keel prepare` end to end on planted corpora: dedup and length filters remove exactly what was
// planted, boundary tokens sit at every document join, JSONL/gzip/zstd/separator inputs read,
// keep-whole packing, the val split, SentencePiece training, and thread-count determinism.
#include <gtest/gtest.h>

#include <zlib.h>
#include <zstd.h>
#include <algorithm>
#include <fstream>

#include "common/error.h"
#include "data/provenance.h"
#include "data/shard_reader.h"
#include "data/tokenizer.h"
#include "data_test_util.h"

namespace keel::data {
namespace {

using keel::testing::ScratchDir;

struct Planted {
  std::vector<std::string> docs;
  int exact = 0, near = 0, short_ = 0, long_ = 0, distinct = 0;
};

Planted planted_corpus() {
  Planted p;
  std::mt19937_64 rng(21);
  std::vector<std::vector<std::string>> bases;
  for (int i = 0; i < 120; ++i) {
    bases.push_back(testing::random_words(rng, 150));
    p.docs.push_back(testing::join(bases.back()));
    ++p.distinct;
  }
  for (int i = 0; i < 12; ++i) {  // same text up to case and whitespace
    std::string d = p.docs[i * 7];
    d[0] = 'W';
    d += "  \n";
    p.docs.push_back(d);
    ++p.exact;
  }
  for (int i = 0; i < 15; ++i) {  // two edited words: Jaccard ~0.92 on word 3-shingles
    p.docs.push_back(testing::join(testing::mutate(bases[i * 5 + 1], 2, rng)));
    ++p.near;
  }
  for (int i = 0; i < 3; ++i) p.docs.push_back("tiny " + std::to_string(i)), ++p.short_;
  for (int i = 0; i < 2; ++i)
    p.docs.push_back(testing::join(testing::random_words(rng, 2000))), ++p.long_;
  return p;
}

// The recommended options remove documents that repeat themselves (a character run, a template
// pasted over and over) and keep ordinary text, and the report says which rule removed how many.
TEST(Prepare, TheRepetitionFilterRemovesSelfRepeatingDocuments) {
  ScratchDir dir("prepare_repetition");
  std::mt19937_64 rng(8);
  std::vector<std::string> docs;
  for (int i = 0; i < 60; ++i) docs.push_back(testing::join(testing::random_words(rng, 80)));
  for (int i = 0; i < 5; ++i) docs.push_back(std::string(200 + 40 * i, "=-*#~"[i]));
  const std::string nav =
      "<ul><li><a href=\"/\">Home</a></li><li><a href=\"/about\">About</a></li>";
  for (int i = 0; i < 4; ++i)
    docs.push_back(nav + " id=" + std::to_string(i) + " " + nav + " id=" + std::to_string(i + 9));
  PrepareOptions o = recommended_prepare_options();
  o.length.drop_percentile_tails = 0;
  o.val_fraction = 0;
  o.seq_len = 64;
  auto r = testing::prepare_docs(dir, docs, o);
  EXPECT_EQ(r["removed_by_repetition"], 9);
  EXPECT_EQ(r["repetition_filter"]["removed"]["one_character"], 5);
  EXPECT_EQ(r["repetition_filter"]["removed"]["repeated_spans"], 4);
  EXPECT_EQ(r["documents_out"], 60);
  o.repetition = {};  // off: all of them stay
  auto kept = testing::prepare_docs(ScratchDir("prepare_repetition_off"), docs, o);
  EXPECT_EQ(kept["removed_by_repetition"], 0);
  EXPECT_EQ(kept["documents_out"], 69);
}

TEST(Prepare, RemovesExactlyThePlantedDuplicatesAndOutliers) {
  ScratchDir dir("prepare_planted");
  auto p = planted_corpus();
  PrepareOptions o;
  o.length.min_length = 20;
  o.length.max_length = 5000;
  o.seq_len = 64;
  auto r = testing::prepare_docs(dir, p.docs, o);
  EXPECT_EQ(r["documents_in"], p.docs.size());
  EXPECT_EQ(r["exact_duplicates"], p.exact);
  EXPECT_EQ(r["near_duplicates"], p.near);
  EXPECT_EQ(r["removed_by_length"], p.short_ + p.long_);
  EXPECT_EQ(r["documents_out"], p.distinct);
  for (const char* k : {"documents_in", "exact_duplicates", "near_duplicates", "removed_by_length",
                        "documents_out", "tokens_out", "length_filter", "splits"})
    EXPECT_TRUE(r.contains(k)) << k;
  EXPECT_TRUE(std::filesystem::exists(dir / "out/report.txt"));

  // Every kept document is in the stream byte for byte, followed by the boundary token.
  auto set = ShardSet::open(dir / "out", "train");
  EXPECT_EQ(set->meta().vocab_size, 257);
  ASSERT_EQ(static_cast<int64_t>(set->documents().size()), p.distinct);
  int64_t tokens = 0;
  for (const auto& rec : set->documents()) {
    const std::string& text = p.docs[rec.doc_id];
    std::vector<int64_t> t(rec.length + 1);
    set->read(rec.offset, rec.length + 1, t.data());
    ASSERT_EQ(rec.length, text.size());
    for (size_t i = 0; i < text.size(); ++i) ASSERT_EQ(t[i], static_cast<unsigned char>(text[i]));
    EXPECT_EQ(t.back(), kByteBoundaryId) << "boundary after document " << rec.doc_id;
    tokens += rec.length;
  }
  EXPECT_EQ(r["tokens_out"], tokens);
  auto meta = nlohmann::json::parse(testing::read_bytes(dir / "out/meta.json"));
  EXPECT_EQ(meta["token_dtype"], "uint16");
  EXPECT_EQ(meta["tokenizer"]["kind"], "byte");
  EXPECT_EQ(meta["inputs"].size(), p.docs.size());
}

TEST(Prepare, PercentileTailsAndValSplitAndDeterminism) {
  ScratchDir a("prepare_tails_a"), b("prepare_tails_b");
  auto docs = testing::distinct_docs(200, 8);
  PrepareOptions o;
  o.length.drop_percentile_tails = 5;
  o.val_fraction = 0.25;
  o.threads = 1;
  auto ra = testing::prepare_docs(a, docs, o);
  o.threads = 3;
  auto rb = testing::prepare_docs(b, docs, o);
  EXPECT_EQ(ra["length_filter"]["removed"]["low_tail"].get<int>() >= 10, true);
  EXPECT_EQ(ra["length_filter"]["removed"]["high_tail"].get<int>() >= 10, true);
  int64_t train = ra["splits"]["train"]["documents"], val = ra["splits"]["val"]["documents"];
  EXPECT_EQ(train + val, ra["documents_out"].get<int64_t>());
  EXPECT_GT(val, 20);
  EXPECT_LT(val, 70);
  auto ma = nlohmann::json::parse(testing::read_bytes(a / "out/meta.json"));
  auto mb = nlohmann::json::parse(testing::read_bytes(b / "out/meta.json"));
  EXPECT_EQ(ma["splits"], mb["splits"]) << "output must not depend on the thread count";
  EXPECT_NO_THROW(ShardSet::open(a / "out", "val"));
}

TEST(Prepare, KeepWholeStartsShortDocumentsOnWindowBoundaries) {
  ScratchDir dir("prepare_whole");
  auto docs = testing::distinct_docs(60, 9);  // 200..500 bytes
  PrepareOptions o;
  o.seq_len = 512;
  o.keep_whole = 1.0;
  auto r = testing::prepare_docs(dir, docs, o);
  auto set = ShardSet::open(dir / "out", "train");
  for (const auto& rec : set->documents())
    EXPECT_LE(rec.offset % 512 + rec.length, 512u) << "document " << rec.doc_id << " split";
  EXPECT_GT(r["packing"]["fill_tokens"].get<int64_t>(), 0);
  // Without it documents straddle windows (the default: nothing is padded).
  ScratchDir plain("prepare_plain");
  o.keep_whole = 0;
  testing::prepare_docs(plain, docs, o);
  auto set2 = ShardSet::open(plain / "out", "train");
  int straddle = 0;
  for (const auto& rec : set2->documents()) straddle += rec.offset % 512 + rec.length > 512;
  EXPECT_GT(straddle, 5);
}

TEST(Prepare, ReadsJsonlGzipZstdAndSeparatedText) {
  ScratchDir dir("prepare_formats");
  auto docs = testing::distinct_docs(30, 10);
  std::filesystem::create_directories(dir / "in");
  std::string jsonl;
  for (int i = 0; i < 10; ++i) jsonl += nlohmann::json{{"body", docs[i]}, {"id", i}}.dump() + "\n";
  jsonl += "{not json\n";
  jsonl += nlohmann::json{{"other", "x"}}.dump() + "\n";
  gzFile gz = gzopen((dir / "in/a.jsonl.gz").c_str(), "wb");
  gzwrite(gz, jsonl.data(), static_cast<unsigned>(jsonl.size()));
  gzclose(gz);
  std::string zjsonl;
  for (int i = 10; i < 20; ++i) zjsonl += nlohmann::json{{"body", docs[i]}}.dump() + "\n";
  std::string z(ZSTD_compressBound(zjsonl.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), zjsonl.data(), zjsonl.size(), 3));
  testing::write_text(dir / "in/b.jsonl.zst", z);
  std::string sep;
  for (int i = 20; i < 30; ++i) sep += docs[i] + "\n%\n";
  testing::write_text(dir / "in/c.txt", sep);
  testing::write_text(dir / "in/d.dat", std::string("\0\1\2binary", 9));
  PrepareOptions o;
  o.inputs = {dir / "in"};
  o.output = dir / "out";
  o.input.text_field = "body";
  o.input.separator = "%";
  o.threads = 2;
  auto r = prepare(o);
  EXPECT_EQ(r["documents_in"], 30);
  EXPECT_EQ(r["documents_out"], 30);
  EXPECT_EQ(r["invalid_records"], 2);
  EXPECT_EQ(r["skipped_files"].size(), 1u);
  // A glob, and a corrupt zstd input is a DataError naming the file.
  testing::write_text(dir / "in/b.jsonl.zst", z.substr(0, z.size() / 2));
  o.inputs = {dir / "in/*.zst"};
  o.overwrite = true;  // into the same output again
  try {
    prepare(o);
    FAIL() << "truncated zstd accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("b.jsonl.zst"), std::string::npos) << e.what();
  }
  o.inputs = {dir / "nothing*.txt"};
  EXPECT_THROW(prepare(o), DataError);
}

// Issue 49: a gzip file cut short is refused naming it (zlib ends it like a whole one, but for the
// error on record), and the compression is told by the bytes, not the name.
TEST(Prepare, ATruncatedGzipIsRefusedAndCompressionIsToldByItsBytes) {
  ScratchDir dir("prepare_compression");
  std::filesystem::create_directories(dir / "in");
  auto docs = testing::distinct_docs(10, 10);
  std::string jsonl;
  for (const auto& d : docs) jsonl += nlohmann::json{{"text", d}}.dump() + "\n";
  // zstd bytes under a .gz name: read as zstd, all 10 documents.
  std::string z(ZSTD_compressBound(jsonl.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), jsonl.data(), jsonl.size(), 3));
  testing::write_text(dir / "in/zstd_bytes.jsonl.gz", z);
  PrepareOptions o;
  o.inputs = {dir / "in/zstd_bytes.jsonl.gz"};
  o.output = dir / "out";
  auto r = prepare(o);
  EXPECT_EQ(r["documents_in"], 10);
  EXPECT_EQ(r["invalid_records"], 0);
  // A whole gzip file, then the same cut in its middle.
  const std::string gz_path = dir / "in/cut.jsonl.gz";
  gzFile gz = gzopen(gz_path.c_str(), "wb");
  gzwrite(gz, jsonl.data(), static_cast<unsigned>(jsonl.size()));
  gzclose(gz);
  std::ifstream whole(gz_path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(whole)), {});
  testing::write_text(gz_path, bytes.substr(0, bytes.size() / 2));
  o.inputs = {gz_path};
  o.overwrite = true;
  try {
    prepare(o);
    FAIL() << "truncated gzip accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jsonl.gz: truncated gzip input"), std::string::npos)
        << e.what();
  }
}

// Issue 49: a document longer than kMaxDocumentBytes (a zstd bomb's line, here a zstd file of
// a few kB that inflates to one 17 MiB JSONL line) is read to its end without being kept, dropped
// and counted; the documents around it are prepared. The same in text mode with a separator.
TEST(Prepare, ADocumentPastTheLimitIsDroppedUnreadAndCounted) {
  ScratchDir dir("prepare_too_long");
  std::filesystem::create_directories(dir / "in");
  const auto docs = testing::distinct_docs(10, 10);
  std::string jsonl;
  for (size_t i = 0; i < docs.size(); ++i) {
    jsonl += nlohmann::json{{"text", docs[i]}}.dump() + "\n";
    if (i == 4)
      jsonl += "{\"text\": \"" + std::string(kMaxDocumentBytes + (1 << 20), 'a') + "\"}\n";
  }
  std::string z(ZSTD_compressBound(jsonl.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), jsonl.data(), jsonl.size(), 3));
  EXPECT_LT(z.size(), 64u << 10) << "a small file";
  testing::write_text(dir / "in/bomb.jsonl.zst", z);
  PrepareOptions o;
  o.inputs = {dir / "in/bomb.jsonl.zst"};
  o.output = dir / "out";
  auto r = prepare(o);
  EXPECT_EQ(r["documents_in"], 11);
  EXPECT_EQ(r["removed_too_long"], 1);
  EXPECT_EQ(r["documents_out"], 10);
  EXPECT_EQ(r["invalid_records"], 0) << "dropped as too long, not as invalid";
  EXPECT_EQ(r["max_document_bytes"], kMaxDocumentBytes);

  std::string text;
  for (size_t i = 0; i < docs.size(); ++i) {
    text += docs[i] + "\n%\n";
    if (i == 2)
      text += std::string(kMaxDocumentBytes / 64, 'x') + "\n" +
              std::string(kMaxDocumentBytes, 'y') + "\n%\n";
  }
  testing::write_text(dir / "in/long.txt", text);
  o.inputs = {dir / "in/long.txt"};
  o.input.separator = "%";
  o.overwrite = true;
  r = prepare(o);
  EXPECT_EQ(r["removed_too_long"], 1);
  EXPECT_EQ(r["documents_out"], 10);
}

// Issue 49: a tokenizer.json pattern that cannot decide within its window on one document (it
// ran past a minute on a megabyte) stops prepare naming the document (file, line, id) and where
// the pattern came from.
TEST(Prepare, APatternThatCannotDecideNamesTheDocumentAndThePattern) {
  ScratchDir dir("prepare_regex_budget");
  nlohmann::json vocab = nlohmann::json::object();
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = c - 'a';
  vocab["<eos>"] = 26;
  const nlohmann::json tokenizer = {
      {"pre_tokenizer",
       {{"type", "Split"},
        {"pattern", {{"Regex", "b(?=b*c)|[a-z]"}}},
        {"behavior", "Isolated"},
        {"invert", false}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"added_tokens", {{{"id", 26}, {"content", "<eos>"}, {"special", true}}}}};
  testing::write_text(dir / "tokenizer.json", tokenizer.dump());
  testing::write_text(dir / "docs.jsonl",
                      nlohmann::json{{"text", "abcabc"}, {"id", "d1"}}.dump() + "\n" +
                          nlohmann::json{{"text", std::string(100000, 'b')}, {"id", "d2"}}.dump() +
                          "\n");
  PrepareOptions o;
  o.inputs = {dir / "docs.jsonl"};
  o.output = dir / "out";
  o.input.id_field = "id";
  o.tokenizer = TokenizerSpec::parse("hf:" + dir / "tokenizer.json");
  try {
    prepare(o);
    FAIL() << "prepared";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("docs.jsonl:2 (id d2): this document cannot be tokenized"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("tokenizer.json: pre_tokenizer Split: the pattern needs to look more "
                        "than 64 KiB ahead"),
              std::string::npos)
        << what;
  }
}

TEST(Prepare, TrainsAndUsesASentencePieceModel) {
  ScratchDir dir("prepare_spm");
  auto docs = testing::distinct_docs(150, 12);
  PrepareOptions o;
  o.tokenizer = TokenizerSpec::parse("spm-train:400");
  auto r = testing::prepare_docs(dir, docs, o);
  auto set = ShardSet::open(dir / "out", "train");
  EXPECT_EQ(set->meta().vocab_size, 400);
  EXPECT_EQ(set->meta().tokenizer["kind"], "spm");
  EXPECT_LT(r["tokens_out"].get<int64_t>(), r["bytes_in"].get<int64_t>());
  auto tok = tokenizer_from_meta(set->meta().tokenizer, dir / "out");
  const auto& rec = set->documents()[0];
  std::vector<int64_t> t(rec.length + 1);
  set->read(rec.offset, rec.length + 1, t.data());
  EXPECT_EQ(t.back(), tok->boundary_id());
  EXPECT_EQ(tok->decode(t.data(), rec.length), docs[rec.doc_id]);
  // spm:MODEL reuses it.
  ScratchDir again("prepare_spm_reuse");
  o.tokenizer = TokenizerSpec::parse("spm:" + (dir / "out/tokenizer.model"));
  auto r2 = testing::prepare_docs(again, docs, o);
  EXPECT_EQ(r2["tokens_out"], r["tokens_out"]);
  o.tokenizer = TokenizerSpec::parse("spm:" + (dir / "missing.model"));
  EXPECT_THROW(testing::prepare_docs(again, docs, o), DataError);
}

// The progress callback sees pass 1 then pass 2, each in order; plain-text inputs give pass 1 its
// total, and each pass ends with every byte read and (pass 2) every token the report counts.
TEST(Prepare, ReportsProgressForBothPassesUpToTheReportsTotals) {
  ScratchDir dir("prepare_progress");
  const auto docs = testing::distinct_docs(5000, 3);  // three blocks of documents per pass
  std::vector<PrepareProgress> seen;
  PrepareOptions o = recommended_prepare_options();
  o.seq_len = 64;
  o.on_progress = [&](const PrepareProgress& p) { seen.push_back(p); };
  const auto r = testing::prepare_docs(dir, docs, o);
  ASSERT_GE(seen.size(), 6u);
  const auto last_of_pass1 =
      std::find_if(seen.begin(), seen.end(), [](const auto& p) { return p.pass == 2; }) - 1;
  for (auto it = seen.begin(); it != seen.end(); ++it) {
    if (it == seen.begin()) continue;
    const auto& prev = *(it - 1);
    if (it->pass == prev.pass) {
      EXPECT_GT(it->documents, prev.documents);
      EXPECT_GE(it->bytes_read, prev.bytes_read);
      EXPECT_GE(it->tokens_out, prev.tokens_out);
    } else {
      EXPECT_EQ(prev.pass, 1);
      EXPECT_EQ(it->pass, 2);
    }
  }
  EXPECT_EQ(last_of_pass1->documents, 5000);
  EXPECT_EQ(last_of_pass1->bytes_total, r["bytes_in"].get<int64_t>());
  EXPECT_EQ(last_of_pass1->bytes_read, last_of_pass1->bytes_total);
  EXPECT_EQ(last_of_pass1->tokens_out, 0);
  EXPECT_EQ(seen.back().pass, 2);
  EXPECT_EQ(seen.back().bytes_read, seen.back().bytes_total);
  EXPECT_EQ(seen.back().tokens_out, r["tokens_out"].get<int64_t>());
}

// --cluster minhash (the default): two documents share a cluster with probability the Jaccard
// similarity of their shingles. Families of edited copies of one text (similar, kept: near dedup
// is off) share clusters often; documents of different families never; by text hash, never.
TEST(Prepare, MinHashClustersGroupSimilarDocuments) {
  constexpr int kFamilies = 5, kVariants = 10;
  std::mt19937_64 rng(5);
  std::vector<std::string> docs;
  for (int f = 0; f < kFamilies; ++f) {
    const auto base = testing::random_words(rng, 60);
    for (int v = 0; v < kVariants; ++v)
      docs.push_back(testing::join(testing::mutate(base, 3, rng)));
  }
  auto shared_pairs = [&](ClusterBy by, const std::string& name) {
    ScratchDir dir(name);
    PrepareOptions o;
    o.near_dedup = false;
    o.cluster = by;
    auto report = testing::prepare_docs(dir, docs, o);
    EXPECT_EQ(report["clusters"]["by"], by == ClusterBy::kMinHash ? "minhash" : "hash");
    auto set = ShardSet::open(dir / "out", "train");
    const auto& recs = set->documents();
    EXPECT_EQ(recs.size(), docs.size());
    int within = 0, across = 0;
    for (size_t i = 0; i < recs.size(); ++i)
      for (size_t j = i + 1; j < recs.size(); ++j)
        if (recs[i].cluster == recs[j].cluster)
          ++(recs[i].doc_id / kVariants == recs[j].doc_id / kVariants ? within : across);
    return std::pair{within, across};
  };
  const int pairs_within = kFamilies * kVariants * (kVariants - 1) / 2;  // 225
  const auto [within, across] = shared_pairs(ClusterBy::kMinHash, "prepare_minhash_clusters");
  EXPECT_GT(within, pairs_within / 4) << "similar documents should often share a cluster";
  EXPECT_EQ(across, 0);
  const auto [within_hash, across_hash] = shared_pairs(ClusterBy::kHash, "prepare_hash_clusters");
  EXPECT_EQ(within_hash, 0);
  EXPECT_EQ(across_hash, 0);
}

// Every input document's provenance: its file, the line it starts on and (JSONL) its id field;
// a damaged provenance file is refused.
TEST(Prepare, ProvenanceNamesFileLineAndIdOfEveryDocument) {
  ScratchDir dir("prepare_provenance");
  std::filesystem::create_directories(dir / "in");
  testing::write_text(dir / "in/a.jsonl",
                      "{\"id\": \"doc-7\", \"text\": \"alpha beta gamma\"}\n\n"
                      "{\"text\": \"delta epsilon\"}\n"
                      "{\"id\": 12, \"text\": \"zeta eta theta\"}\n");
  testing::write_text(dir / "in/b.txt", "one\ntwo\n%\nthree\nfour\n");
  PrepareOptions o;
  o.inputs = {dir / "in"};
  o.output = dir / "out";
  o.input.separator = "%";
  prepare(o);
  const auto meta = nlohmann::json::parse(testing::read_bytes(dir / "out/meta.json"));
  const auto p = Provenance::open(dir / "out", meta);
  const std::string a = dir / "in/a.jsonl", b = dir / "in/b.txt";
  EXPECT_EQ(p->where(0), (nlohmann::json{{"file", a}, {"line", 1}, {"id", "doc-7"}}));
  EXPECT_EQ(p->where(1), (nlohmann::json{{"file", a}, {"line", 3}}));
  EXPECT_EQ(p->where(2), (nlohmann::json{{"file", a}, {"line", 4}, {"id", "12"}}));
  EXPECT_EQ(p->where(3), (nlohmann::json{{"file", b}, {"line", 1}}));
  EXPECT_EQ(p->where(4), (nlohmann::json{{"file", b}, {"line", 4}}));
  EXPECT_EQ(p->where(5), nlohmann::json({{"file", b}}));  // past the last document: its file only
  // One flipped byte in a record: the checksum no longer matches.
  {
    std::fstream f(dir / "out/sources.idx", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(64 + 8);
    f.put('\x55');
  }
  EXPECT_THROW(Provenance::open(dir / "out", meta), DataError);
}

}  // namespace
}  // namespace keel::data
