// Writers of the pre-tokenized formats keel reads (data/foreign_formats.h), written here from the
// formats' own descriptions (Megatron-LM's _IndexWriter and llm.c's write_datafile), not from
// keel's reader, so the tests check the reader against the formats.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace keel::testing {

using TokenDocs = std::vector<std::vector<uint32_t>>;

template <typename T>
void put_le(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// PREFIX.bin / PREFIX.idx as Megatron-LM's IndexedDatasetBuilder writes them with one sequence per
// document: each document's tokens, then `end_token` (preprocess_data.py --append-eod).
// dtype code 8 (uint16) or 4 (int32).
inline void write_megatron(const std::filesystem::path& prefix, const TokenDocs& docs,
                           uint32_t end_token, bool int32 = false) {
  std::string bin, sizes, pointers, doc_index;
  int64_t byte = 0;
  put_le<int64_t>(doc_index, 0);
  for (size_t k = 0; k < docs.size(); ++k) {
    std::vector<uint32_t> seq = docs[k];
    seq.push_back(end_token);
    for (uint32_t t : seq) {
      if (int32) {
        put_le<int32_t>(bin, static_cast<int32_t>(t));
      } else {
        put_le<uint16_t>(bin, static_cast<uint16_t>(t));
      }
    }
    put_le<int32_t>(sizes, static_cast<int32_t>(seq.size()));
    put_le<int64_t>(pointers, byte);
    byte += static_cast<int64_t>(seq.size()) * (int32 ? 4 : 2);
    put_le<int64_t>(doc_index, static_cast<int64_t>(k + 1));
  }
  std::string idx("MMIDIDX\0\0", 9);
  put_le<uint64_t>(idx, 1);
  idx.push_back(static_cast<char>(int32 ? 4 : 8));
  put_le<uint64_t>(idx, docs.size());
  put_le<uint64_t>(idx, docs.size() + 1);
  write_bytes(prefix.string() + ".bin", bin);
  write_bytes(prefix.string() + ".idx", idx + sizes + pointers + doc_index);
}

// llm.c shards: `delimiter` before every document (as dev/data/fineweb.py writes <|endoftext|>),
// and one after the last; the stream cut into `files.size()` shards of near-equal length, so
// documents span shards. uint32 tokens use the Llama-3 header (20240801, version 7).
inline void write_llmc(const std::vector<std::filesystem::path>& files, const TokenDocs& docs,
                       uint32_t delimiter, bool uint32 = false) {
  std::vector<uint32_t> stream;
  for (const auto& d : docs) {
    stream.push_back(delimiter);
    stream.insert(stream.end(), d.begin(), d.end());
  }
  stream.push_back(delimiter);
  const size_t per = (stream.size() + files.size() - 1) / files.size();
  for (size_t f = 0; f < files.size(); ++f) {
    const size_t lo = std::min(stream.size(), f * per), hi = std::min(stream.size(), lo + per);
    std::string bytes;
    put_le<int32_t>(bytes, uint32 ? 20240801 : 20240520);
    put_le<int32_t>(bytes, uint32 ? 7 : 1);
    put_le<int32_t>(bytes, static_cast<int32_t>(hi - lo));
    bytes.resize(256 * 4, '\0');
    for (size_t i = lo; i < hi; ++i) {
      if (uint32) {
        put_le<uint32_t>(bytes, stream[i]);
      } else {
        put_le<uint16_t>(bytes, static_cast<uint16_t>(stream[i]));
      }
    }
    write_bytes(files[f], bytes);
  }
}

// The cluster keel gives a document of pre-tokenized data: XXH3-64 of its ids as int64, low bits.
inline uint32_t foreign_cluster(const std::vector<uint32_t>& tokens) {
  std::vector<int64_t> ids(tokens.begin(), tokens.end());
  return static_cast<uint32_t>(XXH3_64bits(ids.data(), ids.size() * sizeof(int64_t)));
}

// Flips every bit of the byte at `offset` of `path`.
inline void flip_byte(const std::filesystem::path& path, size_t offset) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace keel::testing
