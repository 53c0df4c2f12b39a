// keel prepare on parquet: a file pyarrow writes (tests/tools/jsonl_to_parquet.py, in small row
// groups) prepares to the same shards as the same rows given as JSONL; a quarantined sample from
// it names the parquet file, its row and its id.
#include <gtest/gtest.h>

#include <fstream>

#include "harness.h"

namespace keel::testing {
namespace {

const char* kFortunes = "/usr/share/games/fortunes/fortunes";

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ParquetInput, PreparesAsTheSameRowsInJsonlAndNamesTheRow) {
  if (!std::filesystem::exists(kFortunes)) GTEST_SKIP() << "the fortunes package is not installed";
  const std::string python = setup_env_program("python");
  ASSERT_FALSE(python.empty()) << "no python in the environment scripts/setup.sh makes";
  ScratchDir dir("parquet_input");
  const std::string jsonl = dir / "fortunes.jsonl", parquet = dir / "fortunes.parquet";
  const int64_t records = write_fortunes_jsonl(kFortunes, jsonl);
  ASSERT_GT(records, 300);
  auto r = run_shell(python + " " + source_path("tests/tools/jsonl_to_parquet.py") + " " + jsonl +
                     " " + parquet);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  for (const auto& [input, out] :
       {std::pair{jsonl, dir / "from_jsonl"}, std::pair{parquet, dir / "from_parquet"}}) {
    r = run_keel("prepare --input " + input + " --output " + out + " --seq-len 64");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const auto from_jsonl = dir.path() / "from_jsonl", from_parquet = dir.path() / "from_parquet";
  const auto meta_j = nlohmann::json::parse(read_all(from_jsonl / "meta.json"));
  const auto meta_p = nlohmann::json::parse(read_all(from_parquet / "meta.json"));
  EXPECT_EQ(meta_p["inputs"][0]["format"], "parquet");
  EXPECT_EQ(meta_p["counts"], meta_j["counts"]);
  EXPECT_EQ(meta_p["splits"], meta_j["splits"]);  // every shard's and index's xxh3 included
  for (const auto& e : std::filesystem::directory_iterator(from_jsonl)) {
    const auto name = e.path().filename().string();
    if (name.rfind("train", 0) == 0 || name.rfind("val", 0) == 0)  // the shards and indexes
      EXPECT_EQ(read_all(e.path()), read_all(from_parquet / name)) << name;
  }

  ScratchDir run("parquet_input_run");
  const auto quarantine = quarantine_of_a_bad_region(from_parquet.string(), run.path());
  ASSERT_GE(quarantine.size(), 16u);
  for (const auto& q : quarantine) {
    ASSERT_TRUE(q.contains("source")) << q.dump();
    const auto& source = q["source"];
    const int64_t doc_id = q["doc_id"].get<int64_t>();
    EXPECT_EQ(source["file"], parquet) << q.dump();
    EXPECT_EQ(source["row"].get<int64_t>(), doc_id) << q.dump();  // one document per row
    EXPECT_EQ(source["id"], "fortune-" + std::to_string(doc_id)) << q.dump();
    EXPECT_FALSE(source.contains("line")) << q.dump();
  }
}

// Issue 49: a nested column before the text column (a struct of metadata, as crawls carry) moves
// the leaf-column indices past the schema's field indices; the text column is still the one read
// (keel read the url column as the text), and the shards equal the same rows as JSONL.
TEST(ParquetInput, ANestedColumnBeforeTheTextDoesNotMoveWhatIsRead) {
  const std::string python = setup_env_program("python");
  ASSERT_FALSE(python.empty()) << "no python in the environment scripts/setup.sh makes";
  ScratchDir dir("parquet_nested");
  std::string rows;
  for (int i = 0; i < 40; ++i)
    rows += nlohmann::ordered_json{{"meta", {{"lang", "en"}, {"score", i}}},
                                   {"url", "https://example.org/page/" + std::to_string(i)},
                                   {"text", "document " + std::to_string(i) +
                                                " says something of its own about topic " +
                                                std::to_string(i * 7)},
                                   {"id", "r" + std::to_string(i)}}
                .dump() +
            "\n";
  write_file(dir.path() / "rows.jsonl", rows);
  auto r = run_shell(python + " " + source_path("tests/tools/jsonl_to_parquet.py") + " " +
                     (dir / "rows.jsonl") + " " + (dir / "rows.parquet"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* input : {"rows.jsonl", "rows.parquet"}) {
    r = run_keel("prepare --input " + (dir / input) + " --output " +
                 (dir / (std::string(input) + ".out")) + " --seq-len 16 --no-near-dedup");
    ASSERT_EQ(r.exit_code, 0) << input << "\n" << r.output;
  }
  const auto meta = [&](const char* input) {
    return nlohmann::json::parse(read_all(dir.path() / (std::string(input) + ".out/meta.json")));
  };
  EXPECT_EQ(meta("rows.parquet")["counts"], meta("rows.jsonl")["counts"]);
  EXPECT_EQ(meta("rows.parquet")["splits"], meta("rows.jsonl")["splits"]);
}

// A parquet file without the text column is refused (exit 2) with the columns it has.
TEST(ParquetInput, AMissingTextColumnNamesTheColumnsThere) {
  const std::string python = setup_env_program("python");
  ASSERT_FALSE(python.empty()) << "no python in the environment scripts/setup.sh makes";
  ScratchDir dir("parquet_columns");
  write_file(dir.path() / "rows.jsonl", "{\"body\": \"some text\", \"n\": 1}\n");
  auto r = run_shell(python + " " + source_path("tests/tools/jsonl_to_parquet.py") + " " +
                     (dir / "rows.jsonl") + " " + (dir / "rows.parquet"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_keel("prepare --input " + (dir / "rows.parquet") + " --output " + (dir / "out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no string column 'text'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("body (string)"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "out" / "meta.json"));
  // Parquet read as JSONL (a forced --format): its bytes are binary; the refusal names the file
  // and the format that did it.
  r = run_keel("prepare --input " + (dir / "rows.parquet") + " --format jsonl --output " +
               (dir / "out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the first " + (dir / "rows.parquet")), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("they are parquet files and --format jsonl reads text"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace keel::testing
