// `keel prepare --task I --tasks N` and `--merge` (data/prepare_parts.h) through the real binary:
// the merged dataset is the one a single prepare writes, duplicates across parts are found by the
// merge, and a missing, mismatched or corrupt part is refused before anything is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "harness.h"

namespace keel::testing {
namespace {
namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// Three files of 40 documents of 80 words drawn from 3,000 made-up words (so unrelated documents
// share almost no shingle), of about the same size: with --tasks 3 each file is a part of its own.
// The third file ends with an exact copy of the first file's document 3 and a copy of its document
// 5 with one word changed: duplicates that only a merge over all parts can see.
void write_corpus(const fs::path& dir) {
  const char* syllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa",
                             "do", "fe", "gu", "hi", "jo", "be", "cu", "wa", "xi", "yo"};
  std::vector<std::string> words;
  for (int k = 0; k < 3000; ++k)
    words.push_back(std::string(syllables[k % 20]) + syllables[(k / 20) % 20] +
                    syllables[(k / 400) % 20]);
  std::mt19937 rng(7);
  std::vector<std::string> first;
  for (int f = 0; f < 3; ++f) {
    std::ofstream out(dir / ("corpus_" + std::to_string(f) + ".txt"));
    for (int d = 0; d < 40; ++d) {
      std::string doc;
      for (int w = 0; w < 80; ++w) doc += words[rng() % words.size()] + (w % 12 == 11 ? "\n" : " ");
      if (f == 0) first.push_back(doc);
      out << doc << "\n%\n";
    }
    if (f == 2) {
      std::string near = first[5];
      near.replace(0, near.find(' '), "changed");
      out << first[3] << "\n%\n" << near << "\n%\n";
    }
  }
}

const std::string kFlags = " --separator % --seq-len 64 --val-fraction 0.1 --jobs 1";

// `keel prepare` of dir/corpus_*.txt: the whole, or task `task` of `tasks` into dir/parts.
CommandResult prepare(const ScratchDir& dir, const std::string& output, const std::string& more) {
  return run_keel("prepare --input '" + (dir / "corpus_*.txt") + "' --output " + output + kFlags +
                  more);
}

CommandResult prepare_task(const ScratchDir& dir, int task, const std::string& more = "") {
  return prepare(dir, dir / "parts", " --task " + std::to_string(task) + " --tasks 3" + more);
}

// A SentencePiece model trained on the corpus, then one prepare with it against three tasks and a
// merge with it: the same dataset (tokenizer.model included), and the two planted duplicates,
// each in another part than its original, removed by the merge.
TEST(PrepareParts, ThreeTasksAndAMergeWriteTheDatasetOfOneRun) {
  ScratchDir dir("prepare_parts");
  write_corpus(dir.path());
  auto r = prepare(dir, dir / "spm", " --tokenizer spm-train:300");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string tokenizer = " --tokenizer spm:" + (dir / "spm/tokenizer.model");
  r = prepare(dir, dir / "one", tokenizer);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int task = 0; task < 3; ++task) {
    r = prepare_task(dir, task, tokenizer);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto part = read_json(dir.path() / "parts" /
                                ("part-0000" + std::to_string(task) + "-of-00003") / "part.json");
    EXPECT_EQ(part["files"], nlohmann::json::array({task, task + 1})) << "one file per part";
  }
  r = run_keel("prepare --merge " + (dir / "parts") + " --output " + (dir / "merged"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  EXPECT_GE(expect_same_dataset(dir.path() / "one", dir.path() / "merged"), 6u);
  const auto report = read_json(dir.path() / "merged/report.json");
  EXPECT_EQ(report["documents_in"], 122);
  EXPECT_EQ(report["exact_duplicates"], 1);
  EXPECT_EQ(report["near_duplicates"], 1);
  const auto meta = read_json(dir.path() / "merged/meta.json");
  EXPECT_EQ(meta["tokenizer"]["kind"], "spm");
  ASSERT_EQ(meta["merged_parts"]["commands"].size(), 3u);
  EXPECT_NE(meta["merged_parts"]["commands"][2].get<std::string>().find("--task 2 --tasks 3"),
            std::string::npos);

  // The merged dataset trains.
  r = run_keel("train --run-dir " + (dir / "run") + " --set data.source=shards --set data.path=" +
               (dir / "merged") + " --set model.vocab_size=auto --set run.max_steps=4" + kQuickRun);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Under datatrove's scheme the near duplicates are decided over the whole corpus after the last
// document; parts carry its 64-bit signatures, and the merge decides as one run does: the planted
// exact copy is an exact duplicate, the copy with one word changed a near one.
TEST(PrepareParts, UnderDatatrovesSchemeAMergeDecidesAsOneRun) {
  ScratchDir dir("prepare_parts_datatrove");
  write_corpus(dir.path());
  const std::string scheme = " --minhash-scheme datatrove";
  auto r = prepare(dir, dir / "one", scheme);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int task = 0; task < 3; ++task) {
    r = prepare_task(dir, task, scheme);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  r = run_keel("prepare --merge " + (dir / "parts") + " --output " + (dir / "merged"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(expect_same_dataset(dir.path() / "one", dir.path() / "merged"), 4u);
  const auto report = read_json(dir.path() / "merged/report.json");
  EXPECT_EQ(report["exact_duplicates"], 1);
  EXPECT_EQ(report["near_duplicates"], 1);
  EXPECT_EQ(report["dedup"]["scheme"], "datatrove");
  EXPECT_EQ(report["dedup"]["shingle_size"], 5);
  EXPECT_EQ(report["dedup"]["num_perm"], 112);
  EXPECT_EQ(report["dedup"]["bands"], 14);
  EXPECT_TRUE(report["dedup"]["threshold"].is_null());
}

// More tasks than input files: the extra tasks write empty parts, and the merge is still whole.
TEST(PrepareParts, TasksWithoutFilesWriteEmptyParts) {
  ScratchDir dir("prepare_parts_empty");
  write_corpus(dir.path());
  for (int task = 0; task < 5; ++task) {
    auto r = prepare(dir, dir / "parts", " --task " + std::to_string(task) + " --tasks 5");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  auto r = run_keel("prepare --merge " + (dir / "parts") + " --output " + (dir / "merged"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = prepare(dir, dir / "one", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(expect_same_dataset(dir.path() / "one", dir.path() / "merged"), 4u);
}

// What the merge refuses, each with exit 2, a message naming what is wrong, and no dataset.
TEST(PrepareParts, TheMergeRefusesAMissingAMismatchedOrACorruptPart) {
  ScratchDir dir("prepare_parts_refused");
  write_corpus(dir.path());
  const std::string merge = "prepare --merge " + (dir / "parts") + " --output " + (dir / "data");
  ASSERT_EQ(prepare_task(dir, 0).exit_code, 0);
  ASSERT_EQ(prepare_task(dir, 2).exit_code, 0);
  auto r = run_keel(merge);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("task(s) 1 of 3 have no part"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "data"));

  r = prepare_task(dir, 1, " --seed 7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel(merge);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("part-00001-of-00003/part.json: its options.seed is 7, "
                          "part-00000-of-00003's "),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "data"));

  r = prepare_task(dir, 1);
  EXPECT_EQ(r.exit_code, 2) << "a part is not replaced without --overwrite: " << r.output;
  r = prepare_task(dir, 1, " --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const fs::path tokens = dir.path() / "parts/part-00001-of-00003/tokens.bin";
  {
    std::fstream f(tokens, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(tokens) / 2));
    f.put('\x5a');
  }
  r = run_keel(merge);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(tokens.string() + ": checksum mismatch"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "data"));

  ASSERT_EQ(prepare_task(dir, 1, " --overwrite").exit_code, 0);
  r = run_keel(merge);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir.path() / "data/meta.json"));
}

TEST(PrepareParts, FlagsThatDoNotGoTogetherAreRefused) {
  ScratchDir dir("prepare_parts_flags");
  write_corpus(dir.path());
  const std::string parts = dir / "parts";
  const std::pair<std::string, std::string> cases[] = {
      {prepare(dir, parts, " --task 1").output, "--task and --tasks go together"},
      {prepare(dir, parts, " --task 3 --tasks 3").output, "0 <= --task I < N"},
      {prepare(dir, parts, " --task 0 --tasks 2 --tokenizer spm-train:300").output,
       "--tokenizer spm:PATH/tokenizer.model"},
      {run_keel("prepare --merge " + parts + " --output " + (dir / "d") + " --seed 3").output,
       "--seed with --merge"},
      {run_keel("prepare --merge " + parts + " --output " + (dir / "d")).output,
       "no such directory"},
      {run_keel("prepare --merge " + dir.str() + " --output " + (dir / "d")).output,
       "holds no part"},
      {run_keel("prepare --output " + (dir / "d")).output, "--input is required"},
  };
  for (const auto& [output, expected] : cases)
    EXPECT_NE(output.find(expected), std::string::npos) << "expected '" << expected << "' in\n"
                                                        << output;
  EXPECT_EQ(prepare(dir, parts, " --task 1").exit_code, 2);
  EXPECT_FALSE(fs::exists(parts));
  EXPECT_FALSE(fs::exists(dir.path() / "d"));
}

}  // namespace
}  // namespace keel::testing
