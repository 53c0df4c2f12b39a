// `--tokenizer hf:tokenizer.json` against the Hugging Face tokenizers package itself
// (tests/tools/hf_tokenizer_parity.py, in the venv scripts/setup.sh makes): three tokenizer.json
// files that tokenizers trains and writes (GPT-2's ByteLevel regex; Llama-3's Split then ByteLevel
// with ignore_merges; NFC with cl100k's possessive pattern) encode every document of real text on
// this machine (fortunes, man pages in eleven languages, changelogs, edge cases) to the same ids.
// Then prepare -> train -> export with one of them: the dataset and the export carry that file.
#include <gtest/gtest.h>

#include <fstream>

#include "checkpoint/file_io.h"
#include "data/hf_bpe.h"
#include "harness.h"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The tokenizers-side files in `dir`; fails the test when the venv lacks tokenizers.
void write_reference(const fs::path& dir, const std::string& extra = "") {
  const std::string python = setup_env_program("python");
  ASSERT_FALSE(python.empty()) << "no python in the environment scripts/setup.sh makes";
  auto r = run_shell(python + " " + source_path("tests/tools/hf_tokenizer_parity.py") + " " +
                     dir.string() + extra);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

std::string snippet(const std::string& text) {
  return json(text.substr(0, std::min<size_t>(text.size(), 120))).dump();
}

TEST(HfTokenizer, EncodesAsTokenizersDoesOnRealText) {
  ScratchDir dir("hf_tokenizer_parity");
  write_reference(dir.path());
  const auto docs = read_jsonl(dir / "docs.jsonl");
  ASSERT_GT(docs.size(), 1000u);
  for (const std::string name : {"gpt2", "llama3", "qwen"}) {
    SCOPED_TRACE(name);
    const auto tokenizer = data::load_hf_tokenizer(dir / (name + ".json"));
    std::ifstream expected(dir / ("expected_" + name + ".jsonl"));
    size_t mismatched = 0, tokens = 0;
    std::string line;
    std::vector<uint32_t> ids;
    for (size_t i = 0; i < docs.size() && std::getline(expected, line); ++i) {
      const std::string text = docs[i].at("text").get<std::string>();
      const auto want = json::parse(line).get<std::vector<uint32_t>>();
      ids.clear();
      tokenizer->encode(text, ids);
      tokens += want.size();
      if (ids == want) continue;
      if (++mismatched > 3) continue;
      size_t at = 0;
      while (at < ids.size() && at < want.size() && ids[at] == want[at]) ++at;
      ADD_FAILURE() << "document " << i << " " << snippet(text) << ": keel and tokenizers differ "
                    << "at token " << at << " of " << want.size() << " (keel "
                    << (at < ids.size() ? std::to_string(ids[at]) : "end") << ", tokenizers "
                    << (at < want.size() ? std::to_string(want[at]) : "end") << ")";
    }
    EXPECT_EQ(mismatched, 0u) << "of " << docs.size() << " documents, " << tokens << " tokens";
    // Decoding gives the text back (byte-level: every byte is a token).
    const std::string text = "mixed Кириллица 日本語 tabs\t\tand <|endoftext|> done";
    ids.clear();
    tokenizer->encode(text, ids);
    std::vector<int64_t> wide(ids.begin(), ids.end());
    EXPECT_EQ(tokenizer->decode(wide.data(), wide.size()), text);
  }
}

// prepare keeps the file with the dataset and tokenizes with it; export writes the same bytes
// with a config naming the boundary; a file that is not a tokenizer exits 2 and writes nothing.
TEST(HfTokenizer, PrepareTrainAndExportCarryTheFile) {
  ScratchDir dir("hf_tokenizer_prepare");
  write_reference(dir.path(), " --docs 400 --vocab 600");
  const fs::path input = dir.path() / "input.jsonl";
  fs::copy_file(dir.path() / "docs.jsonl", input);
  const std::string tok = dir / "llama3.json";
  auto r = run_keel("prepare --input " + input.string() + " --output " + (dir / "data") +
                    " --tokenizer hf:" + tok + " --seq-len 32 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json meta = json::parse(checkpoint::read_file(dir.path() / "data" / "meta.json"));
  EXPECT_EQ(meta["tokenizer"]["kind"], "hf");
  EXPECT_EQ(meta["tokenizer"]["boundary_token"], "<|end_of_text|>");
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], 600);
  EXPECT_EQ(checkpoint::read_file(dir.path() / "data" / "tokenizer.json"),
            checkpoint::read_file(tok));

  r = run_keel("train" + kQuickRun + " --set data.source=shards --set data.path=" + (dir / "data") +
               " --set model.vocab_size=auto --set run.max_steps=4 --set stability.enabled=false"
               " --run-dir " +
               (dir / "run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("export " + (dir / "run") + " --format hf --out " + (dir / "hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(checkpoint::read_file(dir.path() / "hf" / "tokenizer.json"),
            checkpoint::read_file(tok));
  const json config =
      json::parse(checkpoint::read_file(dir.path() / "hf" / "tokenizer_config.json"));
  EXPECT_EQ(config["eos_token"], "<|end_of_text|>");

  write_file(dir / "bad.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  r = run_keel("prepare --input " + input.string() + " --output " + (dir / "refused") +
               " --tokenizer hf:" + (dir / "bad.json"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.json: the model Unigram is not BPE"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.path() / "refused"));
}

}  // namespace
}  // namespace keel::testing
