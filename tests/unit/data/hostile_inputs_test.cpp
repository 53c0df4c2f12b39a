// Files from the internet (issue 49): a deterministic mutation loop over every reader of an outside
// format: tokenizer.json (structured mutants as well as byte mutants), parquet, gzip and zstd
// input, Megatron and llm.c token files. Each mutant is read or refused with DataError (exit 2);
// a crash, a hang or any other exception fails the suite. libFuzzer explores further where clang
// links (tests/fuzz, the shard reader; -DKEEL_FUZZ=ON); this loop runs in every build, from the
// same seeds each time (tests/fuzz/seeds, and seeds written here by the formats' own writers).
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "data/foreign_formats.h"
#include "data/hf_bpe.h"
#include "data/parquet_input.h"
#include "data/prepare.h"
#include "data/shard_reader.h"
#include "data_test_util.h"
#include "foreign_writers.h"
#include "test_paths.h"

namespace keel::data {
namespace {

namespace fs = std::filesystem;
using keel::testing::ScratchDir;
using nlohmann::json;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Byte mutants of a seed, as a fuzzer's first moves: flipped bits, a cut, random bytes written
// over a range, a slice deleted or repeated, a 4-byte field set to an extreme.
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string bytes(std::string s) {
    if (s.empty()) return s;
    switch (pick(6)) {
      case 0:
        for (int k = 0, n = 1 + pick(8); k < n; ++k) s[pick(s.size())] ^= char(1 << pick(8));
        break;
      case 1:
        s.resize(pick(s.size()));
        break;
      case 2: {
        const size_t at = pick(s.size()), n = std::min<size_t>(1 + pick(16), s.size() - at);
        for (size_t k = 0; k < n; ++k) s[at + k] = static_cast<char>(pick(256));
        break;
      }
      case 3: {
        const size_t at = pick(s.size()), n = std::min<size_t>(1 + pick(64), s.size() - at);
        s.erase(at, n);
        break;
      }
      case 4: {
        const size_t at = pick(s.size()), n = std::min<size_t>(1 + pick(256), s.size() - at);
        s.insert(pick(s.size()), s.substr(at, n));
        break;
      }
      default: {
        static const uint32_t kExtremes[] = {0,          1,     0x7fffffff, 0x80000000,
                                             0xffffffff, 65535, 65536};
        if (s.size() < 4) break;
        const uint32_t v = kExtremes[pick(std::size(kExtremes))];
        std::memcpy(s.data() + pick(s.size() - 3), &v, 4);
      }
    }
    return s;
  }

  // A structured mutant of a JSON document: one value somewhere replaced by a hostile one (an id
  // out of range or of the wrong type, a deep nest, a pattern that matches the empty string).
  json value(json j) {
    std::vector<json*> nodes;
    std::function<void(json&)> walk = [&](json& n) {
      nodes.push_back(&n);
      if (n.is_structured())
        for (auto& c : n) walk(c);
    };
    walk(j);
    json& target = *nodes[pick(nodes.size())];
    switch (pick(12)) {
      case 0:
        target = -1;
        break;
      case 1:
        target = 4294967296ull;
        break;
      case 2:
        target = 2147483648ull;
        break;
      case 3:
        target = 1e8;
        break;
      case 4:
        target = 12.5;
        break;
      case 5:
        target = true;
        break;
      case 6:
        target = "x*";
        break;
      case 7:
        target = json::array();
        break;
      case 8:
        target = json::object();
        break;
      case 9:
        target = nullptr;
        break;
      case 10: {  // 5,000 Sequences deep (built as text: copying nested values is quadratic)
        static const json deep = [] {
          std::string text;
          for (int k = 0; k < 5000; ++k) text += R"({"type": "Sequence", "normalizers": [)";
          text += "\"z\"";
          for (int k = 0; k < 5000; ++k) text += "]}";
          return json::parse(text);
        }();
        target = deep;
        break;
      }
      default:
        target = std::string(1 + pick(300), '(');
    }
    return j;
  }

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

 private:
  std::mt19937_64 rng_;
};

// Feeds `mutants` mutants of `seed` to `read` (which reads a file at `path`); counts the ones
// read and the ones refused with DataError. Anything else escapes and fails the test.
struct Outcome {
  int read = 0, refused = 0;
};
// KEEL_MUTANTS=K runs K times as many mutants, from other seeds (a longer fuzzing run; the suite
// runs 1).
int scale() {
  const char* k = std::getenv("KEEL_MUTANTS");
  return k && std::atoi(k) > 0 ? std::atoi(k) : 1;
}
Outcome run_mutants(const fs::path& path, int mutants, uint64_t seed,
                    const std::function<std::string(Mutator&)>& mutant,
                    const std::function<void(const fs::path&)>& read) {
  Mutator m(seed * 1000003 + static_cast<uint64_t>(scale()));
  Outcome o;
  for (int k = 0; k < mutants * scale(); ++k) {
    const std::string bytes = mutant(m);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      read(path);
      ++o.read;
    } catch (const DataError&) {
      ++o.refused;
    }
  }
  return o;
}

json seed_tokenizer() {
  return json{{"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}}},
              {"pre_tokenizer",
               {{"type", "Split"},
                {"pattern", {{"Regex", "\\s+|\\w+|[^\\s\\w]+"}}},
                {"behavior", "Isolated"},
                {"invert", false}}},
              {"model",
               {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {" ", 3}, {"<eos>", 4}}},
                {"merges", {"a b"}}}},
              {"added_tokens", {{{"id", 4}, {"content", "<eos>"}, {"special", true}}}},
              {"decoder", {{"type", "ByteLevel"}}}};
}

TEST(HostileInputs, TokenizerJsonMutantsLoadOrAreRefused) {
  ScratchDir dir("hostile_tokenizer");
  const std::string seed = seed_tokenizer().dump();
  const auto read = [](const fs::path& p) {
    const auto tokenizer = load_hf_tokenizer(p);
    std::vector<uint32_t> ids;
    tokenizer->encode("ab ab, ba!\n\xC3\xA9\xFF", ids);  // a loaded one also encodes
  };
  const Outcome bytes = run_mutants(
      dir / "tokenizer.json", 300, 1, [&](Mutator& m) { return m.bytes(seed); }, read);
  const Outcome values = run_mutants(
      dir / "tokenizer.json", 300, 2, [&](Mutator& m) { return m.value(seed_tokenizer()).dump(); },
      read);
  EXPECT_GT(bytes.refused, 0);
  EXPECT_GT(values.read, 0) << "no structured mutant loaded: the loop tests one path only";
  EXPECT_GT(values.refused, 0);
}

TEST(HostileInputs, ParquetMutantsAreReadOrRefused) {
  ScratchDir dir("hostile_parquet");
  for (const char* name : {"docs.parquet", "plain.parquet"}) {
    const std::string seed =
        read_all(fs::path(keel::testing::kSourceDir) / "tests/fuzz/seeds/parquet" / name);
    ASSERT_FALSE(seed.empty()) << name;
    const Outcome o = run_mutants(
        dir / name, 300, 3, [&](Mutator& m) { return m.bytes(seed); },
        [](const fs::path& p) {
          ParquetRows rows(p.string(), "text", "id");
          std::string text, id;
          int64_t row = 0;
          while (rows.next(text, id, row)) {
          }
        });
    EXPECT_GT(o.refused, 0) << name;
  }
}

// Compressed JSONL through the whole of prepare (its reader, filters and tokenizer).
TEST(HostileInputs, GzipAndZstdMutantsArePreparedOrRefused) {
  ScratchDir dir("hostile_compressed");
  std::string jsonl;
  for (const auto& d : testing::distinct_docs(20, 5)) jsonl += json{{"text", d}}.dump() + "\n";
  std::string z(ZSTD_compressBound(jsonl.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), jsonl.data(), jsonl.size(), 3));
  const fs::path gz_path = dir / "seed.jsonl.gz";
  gzFile gz = gzopen(gz_path.c_str(), "wb");
  gzwrite(gz, jsonl.data(), static_cast<unsigned>(jsonl.size()));
  gzclose(gz);
  const std::string gz_bytes = read_all(gz_path);
  int out = 0;
  const auto read = [&](const fs::path& p) {
    PrepareOptions o;
    o.inputs = {p.string()};
    o.output = dir / ("out" + std::to_string(out++));
    o.threads = 1;
    prepare(o);
  };
  const Outcome zstd = run_mutants(
      dir / "m.jsonl.zst", 60, 4, [&](Mutator& m) { return m.bytes(z); }, read);
  const Outcome gzip = run_mutants(
      dir / "m.jsonl.gz", 60, 5, [&](Mutator& m) { return m.bytes(gz_bytes); }, read);
  EXPECT_GT(zstd.refused, 0);
  EXPECT_GT(gzip.refused, 0);
}

// Megatron's .idx and llm.c's .bin: the header, sizes, pointers and tokens mutated.
TEST(HostileInputs, MegatronAndLlmcMutantsAreServedOrRefused) {
  ScratchDir dir("hostile_tokens");
  keel::testing::TokenDocs docs;
  for (uint32_t k = 0; k < 12; ++k) docs.push_back(std::vector<uint32_t>(3 + k % 5, 10 + k));
  keel::testing::write_megatron(dir.path() / "mseed", docs, 256);
  keel::testing::write_llmc({dir.path() / "lseed.bin"}, docs, 256);
  const auto serve = [](config::DataSource format, const fs::path& path) {
    auto set = open_foreign({format, path.string(), "train", 0.0, 264});
    std::vector<int64_t> tokens(64);
    // A record's tokens (an llm.c document's boundary is the delimiter before it: the last one
    // has none after it, as llm.c's own writer leaves it).
    for (const auto& r : set->documents())
      set->read(r.offset, std::min<int64_t>(r.length, 64), tokens.data());
  };
  const std::string idx = read_all(dir / "mseed.idx"), bin = read_all(dir / "lseed.bin");
  fs::copy_file(dir / "mseed.bin", dir / "m.bin");
  const Outcome megatron = run_mutants(
      dir / "m.idx", 300, 6, [&](Mutator& m) { return m.bytes(idx); },
      [&](const fs::path&) { serve(config::DataSource::kMegatron, dir / "m"); });
  fs::create_directories(dir / "llmc");
  const Outcome llmc = run_mutants(
      dir / "llmc/shard.bin", 300, 7, [&](Mutator& m) { return m.bytes(bin); },
      [&](const fs::path& p) { serve(config::DataSource::kLlmc, p); });
  EXPECT_GT(megatron.refused, 0);
  EXPECT_GT(llmc.refused, 0);
}

}  // namespace
}  // namespace keel::data
