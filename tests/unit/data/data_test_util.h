// Helpers shared by the data unit tests: planted corpora, small datasets (in a ScratchDir).
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "data/prepare.h"
#include "scratch_dir.h"

namespace keel::data::testing {

// Not std::filesystem::remove_all: it resolves to libtorch.so's copy and crashes (see
// checkpoint/file_io.h, whose remove_tree is the project's one replacement).
inline void remove_tree(const std::string& path) {
  std::error_code ec;
  checkpoint::remove_tree(path, ec);
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A document of `words` words drawn from a 5000-word synthetic vocabulary.
inline std::vector<std::string> random_words(std::mt19937_64& rng, int words) {
  std::vector<std::string> out;
  for (int i = 0; i < words; ++i) out.push_back("w" + std::to_string(rng() % 5000));
  return out;
}

inline std::string join(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

// Replaces `changes` random words by fresh ones (a near duplicate of decreasing similarity).
inline std::vector<std::string> mutate(std::vector<std::string> words, int changes,
                                       std::mt19937_64& rng) {
  for (int i = 0; i < changes; ++i)
    words[rng() % words.size()] = "x" + std::to_string(rng() % 100000);
  return words;
}

// Prepares `docs` (one file each under dir/in) into dir/out with the byte tokenizer.
inline nlohmann::json prepare_docs(const keel::testing::ScratchDir& dir,
                                   const std::vector<std::string>& docs, PrepareOptions o = {}) {
  std::filesystem::create_directories(dir / "in");
  for (size_t i = 0; i < docs.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "in/doc_%05zu.txt", i);
    write_text(dir / name, docs[i]);
  }
  o.inputs = {dir / "in"};
  o.output = dir / "out";
  if (o.threads == 0) o.threads = 2;
  return prepare(o);
}

// `n` distinct documents of 40..80 words.
inline std::vector<std::string> distinct_docs(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i)
    docs.push_back(join(random_words(rng, 40 + static_cast<int>(rng() % 41))));
  return docs;
}

}  // namespace keel::data::testing
