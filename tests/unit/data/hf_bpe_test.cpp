// tokenizer.json files from the internet (issue 49): a token id is read as the tokenizers library
// reads one (an integer in u32, never cast), never sizes a table by itself, and an added token
// agrees with the vocabulary; each refusal names the file and the key.
#include "data/hf_bpe.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "scratch_dir.h"

namespace keel::data {
namespace {

using keel::testing::ScratchDir;
using nlohmann::json;

// A BPE over "a" and "b" with one merge and <eos> as the boundary.
json small_tokenizer() {
  return json{{"model",
               {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"<eos>", 3}}},
                {"merges", {"a b"}}}},
              {"added_tokens", {{{"id", 3}, {"content", "<eos>"}, {"special", true}}}}};
}

// The message load_hf_tokenizer refuses `j` with; empty when it loads.
std::string refusal(const ScratchDir& d, const json& j) {
  const auto path = d / "tokenizer.json";
  std::ofstream(path) << j.dump();
  try {
    load_hf_tokenizer(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(HfBpeIds, TheSmallTokenizerLoadsAndEncodes) {
  ScratchDir d("hf_bpe_ids_ok");
  std::ofstream(d / "tokenizer.json") << small_tokenizer().dump();
  const auto tokenizer = load_hf_tokenizer(d / "tokenizer.json");
  EXPECT_EQ(tokenizer->vocab_size(), 4);
  EXPECT_EQ(tokenizer->boundary_id(), 3u);
  std::vector<uint32_t> ids;
  tokenizer->encode("abab", ids);
  EXPECT_EQ(ids, (std::vector<uint32_t>{2, 2}));
}

TEST(HfBpeIds, AnIdOutsideU32OrNotAnIntegerIsRefusedNamingTheKey) {
  ScratchDir d("hf_bpe_ids_bad");
  for (const json& bad : {json(-1), json(4294967295ull + 1), json(-5e9), json(12.5), json(true),
                          json("7"), json(nullptr)}) {
    SCOPED_TRACE(bad.dump());
    json j = small_tokenizer();
    j["model"]["vocab"]["b"] = bad;
    const std::string message = refusal(d, j);
    EXPECT_NE(message.find("tokenizer.json"), std::string::npos) << message;
    EXPECT_NE(message.find("model.vocab[\"b\"] is " + bad.dump()), std::string::npos) << message;
    j = small_tokenizer();
    j["added_tokens"][0]["id"] = bad;
    EXPECT_NE(refusal(d, j).find("added_tokens[0].id is " + bad.dump()), std::string::npos);
  }
}

TEST(HfBpeIds, AnIdFarPastTheListedTokensSizesNoTable) {
  ScratchDir d("hf_bpe_ids_far");
  json j = small_tokenizer();
  j["added_tokens"].push_back({{"id", 100000000}, {"content", "<far>"}, {"special", true}});
  const std::string message = refusal(d, j);
  EXPECT_NE(message.find("added_tokens[1].id is 100000000, far past the 6 tokens"),
            std::string::npos)
      << message;
  // The largest id there may be is u32's last; a reserved gap of a few thousand ids still loads.
  j = small_tokenizer();
  j["added_tokens"].push_back({{"id", 4294967295ull}, {"content", "<last>"}, {"special", true}});
  EXPECT_NE(refusal(d, j).find("far past"), std::string::npos);
  j = small_tokenizer();
  j["added_tokens"].push_back({{"id", 5000}, {"content", "<reserved>"}, {"special", true}});
  EXPECT_EQ(refusal(d, j), "");
}

TEST(HfBpeIds, AnAddedTokenWhoseIdDisagreesWithTheVocabularyIsRefused) {
  ScratchDir d("hf_bpe_ids_disagree");
  json j = small_tokenizer();
  j["added_tokens"][0]["id"] = 2;  // "<eos>" is 3 in the vocabulary
  std::string message = refusal(d, j);
  EXPECT_NE(message.find("added_tokens[0] \"<eos>\" has id 2 but model.vocab gives it 3"),
            std::string::npos)
      << message;
  // The key is the token's place in the file's list, also after one keel skips (empty content).
  j["added_tokens"].insert(j["added_tokens"].begin(), json{{"id", 4}, {"content", ""}});
  message = refusal(d, j);
  EXPECT_NE(message.find("added_tokens[1] \"<eos>\" has id 2"), std::string::npos) << message;
}

// Issue 49: a normalizer nested 100,000 deep overflowed the stack in the walk; it is refused while
// parsed. A value of the wrong type deep in a section names the section.
TEST(HfBpeIds, ADeepNestOrAWrongTypeIsRefusedNamingWhere) {
  ScratchDir d("hf_bpe_hostile");
  std::string deep;
  for (int k = 0; k < 100000; ++k) deep += R"({"type": "Sequence", "normalizers": [)";
  deep += R"({"type": "NFC"})";
  for (int k = 0; k < 100000; ++k) deep += "]}";
  json j = small_tokenizer();
  std::string text = j.dump();
  text.insert(1, "\"normalizer\": " + deep + ", ");
  std::ofstream(d / "tokenizer.json") << text;
  try {
    load_hf_tokenizer(d / "tokenizer.json");
    FAIL() << "loaded";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json: nested more than 64 levels deep"),
              std::string::npos)
        << std::string(e.what()).substr(0, 300);
  }
  j = small_tokenizer();
  j["model"]["merges"] = json::array({json::array({1, 2})});
  const std::string why = refusal(d, j);
  EXPECT_NE(why.find("in \"model\": "), std::string::npos) << why;
  EXPECT_EQ(why.find("[json.exception"), std::string::npos) << why;
}

}  // namespace
}  // namespace keel::data
