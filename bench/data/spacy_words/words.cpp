// Reads NUL-separated texts and writes, NUL-separated, the words keel's --minhash-scheme datatrove
// shingles each into (datatrove_simplify, then spacy_en_words), joined by \x1f: parity.py's keel
// side. Built by parity.py.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/datatrove_minhash.h"
#include "data/spacy_en_words.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::ifstream in(argv[1], std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string all = buffer.str();
  std::ofstream out(argv[2], std::ios::binary);
  for (size_t pos = 0; pos <= all.size();) {
    size_t end = all.find('\0', pos);
    if (end == std::string::npos) end = all.size();
    const std::string simple =
        keel::data::datatrove_simplify(std::string_view(all).substr(pos, end - pos));
    std::vector<std::string_view> words;
    keel::data::spacy_en_words(simple, words);
    for (size_t i = 0; i < words.size(); ++i) out << (i ? "\x1f" : "") << words[i];
    out << '\0';
    pos = end + 1;
  }
  return 0;
}
