// data.source megatron and llmc through the real binary: files written here by writers that follow
// Megatron-LM's and llm.c's formats (tests/foreign_writers.h) train to exactly the losses of the
// same tokens and documents given as keel shards; a damaged file is refused with exit 2 naming it;
// without data.val_path the last documents are held out for validation.
#include <gtest/gtest.h>

#include "data/shard_format.h"
#include "data/shard_writer.h"
#include "foreign_writers.h"
#include "harness.h"

namespace keel::testing {
namespace {

constexpr uint32_t kEnd = 256;  // the byte tokenizer's boundary

// Text-like documents of byte tokens: words from a small list, so the loss has something to learn.
TokenDocs word_docs(uint64_t seed, int n) {
  static const char* kWords[] = {"the", "stable", "run",  "of",    "a",    "model", "needs", "data",
                                 "and", "care",   "loss", "falls", "when", "steps", "go",    "on"};
  TokenDocs docs;
  uint64_t x = seed;
  auto next = [&x] { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int d = 0; d < n; ++d) {
    std::vector<uint32_t> t;
    const int words = 8 + static_cast<int>(next() % 40);
    for (int w = 0; w < words; ++w) {
      for (const char* c = kWords[next() % 16]; *c; ++c) t.push_back(static_cast<uint8_t>(*c));
      t.push_back(' ');
    }
    docs.push_back(t);
  }
  return docs;
}

// The same documents as a keel dataset (train and val splits), in the stream layout the foreign
// file has: Megatron's document then its end token; llm.c's delimiter then the document, which is
// keel's layout after one leading boundary token. Clusters as keel assigns pre-tokenized ones.
void write_keel_copy(const std::filesystem::path& dir, const TokenDocs& train, const TokenDocs& val,
                     bool llmc_layout) {
  std::filesystem::create_directories(dir);
  nlohmann::json splits;
  for (const auto& [name, docs] : {std::pair{"train", &train}, std::pair{"val", &val}}) {
    data::SplitWriter w(dir.string(), name, 2, 257, kEnd, 4096);
    if (llmc_layout) w.add_fill(1);
    for (size_t k = 0; k < docs->size(); ++k) {
      auto hashed = (*docs)[k];
      if (!llmc_layout) hashed.push_back(kEnd);
      w.add_document((*docs)[k], k, foreign_cluster(hashed));
    }
    splits[name] = w.finish();
  }
  const nlohmann::json meta = {{"format", data::kMetaFormatName},
                               {"version", data::kShardFormatVersion},
                               {"vocab_size", 257},
                               {"token_dtype", "uint16"},
                               {"boundary_id", kEnd},
                               {"tokenizer", {{"kind", "byte"}}},
                               {"splits", splits}};
  write_file(dir / "meta.json", meta.dump());
}

const std::string kRun =
    " --set model.vocab_size=264 --set model.seq_len=64 --set data.micro_batch_size=8"
    " --set run.max_steps=30 --set schedule.warmup_steps=5 --set eval.every_steps=15"
    " --set eval.batches=2 --set checkpoint.every_steps=10 --set logging.every_steps=1"
    " --set logging.progress=off";

std::vector<double> values(const std::filesystem::path& file, const char* key) {
  std::vector<double> out;
  for (const auto& line : read_jsonl(file))
    if (line.contains(key)) out.push_back(line[key].get<double>());
  return out;
}

// Trains `source` at `path` (val at `val`) into run_dir; returns the losses, then the val losses.
std::pair<std::vector<double>, std::vector<double>> train(const ScratchDir& dir,
                                                          const std::string& run,
                                                          const std::string& source,
                                                          const std::string& path,
                                                          const std::string& val) {
  auto r = run_keel("train --run-dir " + (dir / run) + " --set data.source=" + source +
                    " --set 'data.path=" + path + "'" +
                    (val.empty() ? std::string() : " --set data.val_path=" + val) + kRun);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return {values(dir.path() / run / "metrics.jsonl", "loss"),
          values(dir.path() / run / "eval.jsonl", "val_loss")};
}

TEST(ForeignData, MegatronAndLlmcTrainAsTheSameTokensInKeelShards) {
  ScratchDir dir("foreign_train");
  const TokenDocs train_docs = word_docs(1, 500), val_docs = word_docs(2, 60);
  write_megatron(dir.path() / "train_text_document", train_docs, kEnd);
  write_megatron(dir.path() / "val_text_document", val_docs, kEnd, /*int32=*/true);
  write_keel_copy(dir.path() / "as_megatron", train_docs, val_docs, /*llmc_layout=*/false);
  std::filesystem::create_directories(dir.path() / "llmc");
  write_llmc({dir.path() / "llmc/fw_train_000000.bin", dir.path() / "llmc/fw_train_000001.bin"},
             train_docs, kEnd);
  write_llmc({dir.path() / "llmc/fw_val_000000.bin"}, val_docs, kEnd);
  write_keel_copy(dir.path() / "as_llmc", train_docs, val_docs, /*llmc_layout=*/true);

  const auto megatron =
      train(dir, "megatron", "megatron", dir / "train_text_document", dir / "val_text_document");
  const auto shards_m = train(dir, "shards_m", "shards", dir / "as_megatron", "");
  ASSERT_EQ(megatron.first.size(), 30u);
  EXPECT_EQ(megatron.first, shards_m.first);    // bit for bit: the same batches in the same order
  EXPECT_EQ(megatron.second, shards_m.second);  // and the same validation windows
  EXPECT_LT(megatron.first.back(), megatron.first.front() - 1.0);

  const auto llmc =
      train(dir, "llmc", "llmc", dir / "llmc/fw_train_*.bin", dir / "llmc/fw_val_000000.bin");
  const auto shards_l = train(dir, "shards_l", "shards", dir / "as_llmc", "");
  ASSERT_EQ(llmc.first.size(), 30u);
  EXPECT_EQ(llmc.first, shards_l.first);
  EXPECT_EQ(llmc.second, shards_l.second);
  EXPECT_NE(llmc.first, megatron.first);  // another layout of the stream: other windows

  // Without data.val_path the last 2 % of the documents are the val split.
  const auto held = train(dir, "held_out", "megatron", dir / "train_text_document", "");
  EXPECT_EQ(held.first.size(), 30u);
  EXPECT_EQ(held.second.size(), 3u);  // steps 0, 15, 30
}

TEST(ForeignData, DamagedFilesAndAMissingVocabularyExitTwo) {
  ScratchDir dir("foreign_damage");
  const TokenDocs docs = word_docs(3, 200);
  const std::string prefix = dir / "c";
  const std::string base = " --set data.source=megatron --set data.path=" + prefix + kRun;
  write_megatron(prefix, docs, kEnd);
  EXPECT_EQ(run_keel("validate" + base).exit_code, 0);

  auto r = run_keel("validate" + base + " --set model.vocab_size=auto");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("model.vocab_size"), std::string::npos) << r.output;

  flip_byte(prefix + ".idx", 40);  // a sequence's size
  r = run_keel("validate" + base);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(prefix + ".idx: byte"), std::string::npos) << r.output;

  // A token byte: only training reads the tokens; it refuses before writing anything.
  write_megatron(prefix, docs, kEnd);
  flip_byte(prefix + ".bin", 2 * 100 + 1);
  r = run_keel("train --run-dir " + (dir / "run") + base);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(prefix + ".bin: token 100 is id"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "run" / "metrics.jsonl"));

  write_llmc({dir.path() / "s.bin"}, docs, kEnd);
  flip_byte(dir.path() / "s.bin", 8);  // the token count
  r = run_keel("validate --set data.source=llmc --set data.path=" + (dir / "s.bin") + kRun);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("s.bin: byte 8: the header says"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
