// Hugging Face tokenizer files from a prepared dataset: the byte-level tokenizer.json (GPT-2's
// byte map, id = byte, the boundary special), and a SentencePiece model's files.
// (tests/integration/hf_test.cpp loads them with transformers.)
#include "data/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/file_io.h"
#include "common/error.h"
#include "data/tokenizer.h"
#include "scratch_dir.h"

namespace keel::data {
namespace {

using keel::testing::ScratchDir;
using nlohmann::json;

TEST(HfTokenizer, Gpt2ByteMapIsABijectionOntoPrintableCharacters) {
  const auto& chars = gpt2_byte_chars();
  ASSERT_EQ(chars.size(), 256u);
  EXPECT_EQ(std::set<std::string>(chars.begin(), chars.end()).size(), 256u);
  EXPECT_EQ(chars['A'], "A");
  EXPECT_EQ(chars['~'], "~");
  EXPECT_EQ(chars[' '], "\u0120");   // GPT-2's "Ġ"
  EXPECT_EQ(chars['\n'], "\u010A");  // "Ċ"
  EXPECT_EQ(chars[0], "\u0100");
  EXPECT_EQ(chars[0xAD], "\u0143");  // the soft hyphen is not printable: the 68th remapped byte
  EXPECT_EQ(chars[0xFF], "\u00FF");
}

TEST(HfTokenizer, ByteLevelTokenizerJson) {
  ScratchDir d("hf_tok_byte");
  std::ofstream(d / "meta.json") << json{{"tokenizer", make_byte_tokenizer()->describe()}}.dump();
  std::filesystem::create_directories(d.path() / "out");
  const auto files = write_hf_tokenizer(d.path(), d.path() / "out", 128);
  EXPECT_EQ(files.kind, "byte");
  EXPECT_EQ(files.eos_id, 256);
  const auto tok = json::parse(checkpoint::read_file(d.path() / "out/tokenizer.json"));
  const auto& vocab = tok["model"]["vocab"];
  EXPECT_EQ(vocab.size(), 257u);
  EXPECT_EQ(vocab["\u0120"], 32);
  EXPECT_EQ(vocab["<|endoftext|>"], 256);
  EXPECT_TRUE(tok["model"]["merges"].empty());
  EXPECT_EQ(tok["pre_tokenizer"]["use_regex"], false);
  EXPECT_EQ(tok["added_tokens"][0]["id"], 256);
  EXPECT_EQ(tok["added_tokens"][0]["special"], true);
  const auto cfg = json::parse(checkpoint::read_file(d.path() / "out/tokenizer_config.json"));
  EXPECT_EQ(cfg["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(cfg["eos_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["add_bos_token"], false);
  EXPECT_EQ(cfg["model_max_length"], 128);
}

TEST(HfTokenizer, SentencePieceUnigramGetsATokenizerJson) {
  ScratchDir d("hf_tok_spm");
  std::ofstream text(d / "text.txt");
  for (int i = 0; i < 300; ++i)
    text << "the quick brown fox " << i << " jumps over the lazy dog, again and again\n";
  text.close();
  train_spm(d / "text.txt", 300, d / "tokenizer", 1, 7);
  const auto spm = load_spm_tokenizer(d / "tokenizer.model");
  std::ofstream(d / "meta.json") << json{{"tokenizer", spm->describe()}}.dump();
  std::filesystem::create_directories(d.path() / "out");
  const auto files = write_hf_tokenizer(d.path(), d.path() / "out", 64);
  EXPECT_EQ(files.kind, "spm");
  EXPECT_EQ(files.eos_id, spm->boundary_id());
  EXPECT_EQ(checkpoint::read_file(d.path() / "out/tokenizer.model"),
            checkpoint::read_file(d.path() / "tokenizer.model"));
  const auto tok = json::parse(checkpoint::read_file(d.path() / "out/tokenizer.json"));
  EXPECT_EQ(tok["model"]["type"], "Unigram");
  EXPECT_EQ(tok["model"]["vocab"].size(), 300u);
  EXPECT_EQ(tok["model"]["byte_fallback"], true);
  EXPECT_EQ(tok["normalizer"]["normalizers"][0]["type"], "Precompiled");
  const auto cfg = json::parse(checkpoint::read_file(d.path() / "out/tokenizer_config.json"));
  EXPECT_EQ(cfg["eos_token"], "</s>");
  EXPECT_EQ(cfg["unk_token"], "<unk>");
}

TEST(HfTokenizer, UnknownKindAndMissingMetaAreDataErrors) {
  ScratchDir d("hf_tok_bad");
  EXPECT_THROW(write_hf_tokenizer(d.path(), d.path(), 8), DataError);
  std::ofstream(d / "meta.json") << R"({"tokenizer": {"kind": "wordpiece"}})";
  EXPECT_THROW(write_hf_tokenizer(d.path(), d.path(), 8), DataError);
}

}  // namespace
}  // namespace keel::data
