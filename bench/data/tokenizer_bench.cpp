// keel's tokenizer.json encoder on one thread: documents of a JSONL file ({"text": ...}), each
// encoded once to warm the word cache as a long prepare has it warm, then timed over --repeat
// passes. Prints one JSON line: documents, bytes, tokens, seconds, MB/s, tokens/s.
//   keel_bench_tokenizer TOKENIZER_JSON DOCS_JSONL [--repeat N]
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/hf_bpe.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: keel_bench_tokenizer TOKENIZER_JSON DOCS_JSONL [--repeat N]\n";
    return 2;
  }
  int repeat = 3;
  if (argc >= 5 && std::string(argv[3]) == "--repeat") repeat = std::stoi(argv[4]);
  const auto tokenizer = keel::data::load_hf_tokenizer(argv[1]);
  std::vector<std::string> docs;
  std::ifstream in(argv[2]);
  size_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    bytes += docs.back().size();
  }
  std::vector<uint32_t> ids;
  for (const auto& d : docs) tokenizer->encode(d, ids);  // warm-up
  size_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repeat; ++r)
    for (const auto& d : docs) {
      ids.clear();
      tokenizer->encode(d, ids);
      tokens += ids.size();
    }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double total = static_cast<double>(bytes) * repeat;
  std::cout << nlohmann::json{{"documents", docs.size()},
                              {"bytes", bytes},
                              {"tokens", tokens / repeat},
                              {"seconds", seconds / repeat},
                              {"mb_per_s", total / seconds / 1e6},
                              {"tokens_per_s", static_cast<double>(tokens) / seconds}}
                   .dump()
            << "\n";
}
