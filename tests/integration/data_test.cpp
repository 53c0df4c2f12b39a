// `keel prepare` as a user runs it: report.json's keys and dedup/length counts on a planted
// corpus, the dataset verifies on load, and wrong input exits 2 with a message.
#include <gtest/gtest.h>

#include <filesystem>

#include "../unit/data/data_test_util.h"
#include "data/shard_reader.h"
#include "harness.h"

namespace keel::testing {
namespace {

// A dataset whose train split holds no token (an older keel's, or edited by hand: prepare refuses
// to write one) fails validate, as train would, naming data.path.
TEST(PrepareCommand, ADatasetWithNoTrainTokenFailsValidate) {
  ScratchDir dir("validate_no_tokens");
  std::filesystem::create_directories(dir / "in");
  for (int i = 0; i < 50; ++i)
    write_file(dir / ("in/d" + std::to_string(i) + ".txt"),
               "document number " + std::to_string(i) + " with words enough for the filters");
  auto r = run_keel("prepare --input " + (dir / "in") + " --output " + (dir / "data"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::filesystem::path meta_path = dir.path() / "data/meta.json";
  nlohmann::json meta = nlohmann::json::parse(data::testing::read_bytes(meta_path.string()));
  meta["splits"]["train"] = meta["splits"]["val"];  // no shard, no token
  meta["splits"]["train"]["index"]["file"] = "train.idx";
  std::filesystem::copy_file(dir.path() / "data/val.idx", dir.path() / "data/train.idx",
                             std::filesystem::copy_options::overwrite_existing);
  write_file(meta_path, meta.dump());
  r = run_keel("validate --no-probe --set data.source=shards --set data.path=" + (dir / "data") +
               " --set model.vocab_size=auto");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("data.path: " + (dir / "data") +
                          ": the dataset's train split holds no "
                          "token"),
            std::string::npos)
      << r.output;
}

TEST(PrepareCommand, WritesVerifiedShardsAndAReport) {
  ScratchDir dir("prepare_cli");
  std::mt19937_64 rng(5);
  std::filesystem::create_directories(dir / "in");
  std::vector<std::vector<std::string>> bases;
  int n = 0;
  auto put = [&](const std::string& text) {
    write_file(dir / ("in/d" + std::to_string(1000 + n++) + ".txt"), text);
  };
  for (int i = 0; i < 80; ++i) {
    bases.push_back(data::testing::random_words(rng, 120));
    put(data::testing::join(bases.back()));
  }
  for (int i = 0; i < 6; ++i) put(data::testing::join(bases[i]) + "\n");  // exact
  for (int i = 0; i < 9; ++i)
    put(data::testing::join(data::testing::mutate(bases[10 + i], 1, rng)));  // near
  put("short");                                                              // length
  auto out = dir.str() + "/out";
  auto r = run_keel("prepare --input " + dir.str() + "/in --output " + out +
                    " --min-length 10 --threads 2 --val-fraction 0.1 --seq-len 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto report = nlohmann::json::parse(data::testing::read_bytes(out + "/report.json"));
  EXPECT_EQ(report["documents_in"], 96);
  EXPECT_EQ(report["exact_duplicates"], 6);
  EXPECT_EQ(report["near_duplicates"], 9);
  EXPECT_EQ(report["removed_by_length"], 1);
  EXPECT_EQ(report["documents_out"], 80);
  EXPECT_GT(report["tokens_out"].get<int64_t>(), 80 * 400);
  auto meta = nlohmann::json::parse(data::testing::read_bytes(out + "/meta.json"));
  EXPECT_NE(meta["prepare_command"].get<std::string>().find("--val-fraction"), std::string::npos);
  EXPECT_NO_THROW(data::ShardSet::open(out, "train"));
  EXPECT_NO_THROW(data::ShardSet::open(out, "val"));
  EXPECT_NE(r.output.find("80 documents"), std::string::npos) << r.output;
}

// A prepare that keeps no document (here: the text is under another key than --text-field) is
// exit 2, says why, and writes nothing: not a dataset that only `keel train` would refuse.
TEST(PrepareCommand, KeepingNoDocumentExitsTwoAndWritesNothing) {
  ScratchDir dir("prepare_cli_empty");
  write_file(dir / "docs.jsonl",
             "{\"text\": \"the first document\"}\n{\"text\": \"the second\"}\n");
  const std::string out = dir / "out";
  auto r = run_keel("prepare --input " + dir / "docs.jsonl" + " --output " + out +
                    " --text-field content");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no document is left to write (0 document(s) read, 2 invalid record(s)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--text-field"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out)) << r.output;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename(), "docs.jsonl") << "left behind: " << e.path();
}

TEST(PrepareCommand, WrongInputExitsTwoWithAMessage) {
  ScratchDir dir("prepare_cli_bad");
  auto r = run_keel("prepare --input " + dir.str() + "/missing --output " + dir.str() + "/out");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("missing"), std::string::npos) << r.output;
  write_file(dir / "a.txt", "some text here");
  r = run_keel("prepare --input " + dir.str() + "/a.txt --output " + dir.str() +
               "/out --tokenizer bpe");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tokenizer"), std::string::npos) << r.output;
  r = run_keel("prepare --input " + dir.str() + "/a.txt --output " + dir.str() +
               "/out --num-perm 100 --bands 16");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // datatrove's scheme has no similarity check and shingles words: both flags are refused.
  for (const char* flag : {"--dedup-threshold 0.7", "--shingle char"}) {
    r = run_keel("prepare --input " + dir.str() + "/a.txt --output " + dir.str() +
                 "/out --minhash-scheme datatrove " + flag);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(std::string(flag).substr(0, std::string(flag).find(' '))),
              std::string::npos)
        << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

// The demo corpus of configs/fortunes.yaml (Debian's `fortunes` package), when installed.
TEST(PrepareCommand, PreparesTheFortunesCorpus) {
  const std::string fortunes = "/usr/share/games/fortunes";
  if (!std::filesystem::exists(fortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  ScratchDir dir("prepare_fortunes");
  auto r =
      run_keel("prepare --input " + fortunes + " --output " + dir.str() +
               " --separator % --cluster source --seq-len 256 --val-fraction 0.05 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto report = nlohmann::json::parse(data::testing::read_bytes(dir.str() + "/report.json"));
  EXPECT_GT(report["documents_out"].get<int64_t>(), 1000);
  EXPECT_GT(report["skipped_files"].size(), 0u);  // the .dat indexes
  EXPECT_EQ(data::shard_vocab_size(dir.str()), 257);
  // meta.json records the command as it was given, --cluster's word included (it was its number).
  const auto meta = nlohmann::json::parse(data::testing::read_bytes(dir.str() + "/meta.json"));
  EXPECT_NE(meta["prepare_command"].get<std::string>().find("--cluster source"), std::string::npos)
      << meta["prepare_command"];
}

// What a dataset's meta.json says of the whole dataset is said once, not once per split (the
// guide's output showed the seq_len line twice: issue 52).
TEST(PrepareCommand, TrainingAtAnotherSeqLenSaysSoOnce) {
  ScratchDir dir("prepare_seq_len_once");
  std::mt19937_64 rng(7);
  std::filesystem::create_directories(dir / "in");
  for (int i = 0; i < 120; ++i)
    write_file(dir / ("in/d" + std::to_string(i) + ".txt"),
               data::testing::join(data::testing::random_words(rng, 150)));
  auto r = run_keel("prepare --input " + (dir / "in") + " --output " + (dir / "data") +
                    " --seq-len 64 --val-fraction 0.2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("train --run-dir " + (dir / "run") +
               " --set data.source=shards --set data.path=" + (dir / "data") +
               " --set model.vocab_size=auto --set run.max_steps=2 --set schedule.warmup_steps=1"
               " --set eval.every_steps=2 --set data.micro_batch_size=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string line = "prepared for seq_len 64, training with 128";
  const size_t first = r.output.find(line);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(line, first + 1), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(validation)"), std::string::npos) << r.output;  // val was opened too
}

// Every core changes how fast, never what: --jobs 2 writes the same shards, index and vocabulary as
// --jobs 1 (meta.json and the reports differ only in the command line and the timings).
TEST(PrepareCommand, JobsDoNotChangeTheOutput) {
  const std::string fortunes = "/usr/share/games/fortunes";
  if (!std::filesystem::exists(fortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  ScratchDir dir("prepare_jobs");
  for (const char* jobs : {"1", "2"}) {
    auto r = run_keel("prepare --input " + fortunes + " --output " + (dir / jobs) +
                      " --separator % --seq-len 256 --val-fraction 0.05 --jobs " + jobs);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  EXPECT_GE(expect_same_dataset(dir.path() / "1", dir.path() / "2"), 2u);
  auto meta = [&](const char* jobs) {
    return nlohmann::json::parse(data::testing::read_bytes(dir / jobs + "/meta.json"));
  };
  EXPECT_NE(meta("2")["prepare_command"].get<std::string>().find("--jobs 2"), std::string::npos);
}

// JSONL records that are not documents (not JSON, no text field) change nothing but the count: the
// second pass, which parses only the documents it packs, maps every record to the same document
// as the first; the shards equal those of the same records without the invalid lines, at --jobs 1
// and 2.
TEST(PrepareCommand, InvalidJsonlRecordsAreSkippedAlikeInBothPasses) {
  const std::string fortunes = "/usr/share/games/fortunes/fortunes";
  if (!std::filesystem::exists(fortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  ScratchDir dir("prepare_invalid");
  const int64_t records = write_fortunes_jsonl(fortunes, dir.path() / "clean.jsonl");
  ASSERT_GT(records, 100);
  {
    std::ifstream in(dir.path() / "clean.jsonl");
    std::ofstream out(dir.path() / "dirty.jsonl");
    std::string line;
    for (int64_t k = 0; std::getline(in, line); ++k) {
      if (k % 37 == 0) out << (k % 2 ? "not json at all\n" : "{\"title\": \"no text field\"}\n");
      out << line << "\n";
    }
  }
  const std::string flags = " --seq-len 128 --val-fraction 0.05 --id-field nothing";
  for (const std::string name : {"clean", "dirty"})
    for (const char* jobs : {"1", "2"}) {
      auto r = run_keel("prepare --input " + (dir / (name + ".jsonl")) + " --output " +
                        (dir / (name + jobs)) + flags + " --jobs " + jobs);
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
  const auto report = nlohmann::json::parse(data::testing::read_bytes(dir / "dirty2/report.json"));
  EXPECT_EQ(report["invalid_records"].get<int64_t>(), (records + 36) / 37);
  EXPECT_EQ(report["documents_in"].get<int64_t>(), records);
  EXPECT_GE(expect_same_dataset(dir.path() / "dirty1", dir.path() / "dirty2"), 4u);
  for (const char* file : {"train.idx", "train_00000.bin", "val.idx", "val_00000.bin"})
    EXPECT_TRUE(data::testing::read_bytes(dir / "clean1/" + file) ==
                data::testing::read_bytes(dir / "dirty2/" + file))
        << file;
}

}  // namespace
}  // namespace keel::testing
