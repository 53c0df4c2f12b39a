// Where each document of a prepared dataset came from, so a sample found in training (quarantine,
// forensics, the report) leads a person to the raw record: its input file, the line it starts on
// (a JSONL record's line) and, for JSONL, the record's own id field. `keel prepare` writes it for
// every input document, in document-id order, beside the shards:
//   sources.idx   a FileHeader (magic KEELSRC), then per document {uint64 line, uint64 id_end}: its
//                 id is bytes [previous id_end, id_end) of sources.ids
//   sources.ids   a FileHeader (magic KEELSID), then the ids' bytes
// meta.json lists both with their xxh3 ("sources") and maps document ids to files ("inputs").
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace keel::data {

class HeaderedFileWriter;

inline constexpr char kSourcesMagic[8] = {'K', 'E', 'E', 'L', 'S', 'R', 'C', '\n'};
inline constexpr char kSourceIdsMagic[8] = {'K', 'E', 'E', 'L', 'S', 'I', 'D', '\n'};

// Writes sources.idx and sources.ids into `dir`, streaming. Not thread-safe.
class SourceWriter {
 public:
  explicit SourceWriter(const std::string& dir);
  ~SourceWriter();
  SourceWriter(const SourceWriter&) = delete;
  SourceWriter& operator=(const SourceWriter&) = delete;
  void add(int64_t line, std::string_view id);
  // Closes both files; returns meta.json's "sources": {index: {file, records, xxh3}, ids: {file,
  // bytes, xxh3}}.
  nlohmann::json finish();

 private:
  std::unique_ptr<HeaderedFileWriter> index_, ids_;
  uint64_t id_end_ = 0, records_ = 0;
};

class MappedFile;

// Reads a dataset's provenance back; open() checks both files against meta.json.
class Provenance {
 public:
  // Without "sources" in meta.json (a dataset prepared before provenance) where() names the input
  // file alone. Throws DataError for files that disagree with meta.json.
  static std::unique_ptr<Provenance> open(const std::string& dir, const nlohmann::json& meta);
  ~Provenance();
  // {file, line (parquet: row), id (when the record had one)} of document `doc_id`; {} when out
  // of range.
  nlohmann::json where(uint64_t doc_id) const;

 private:
  Provenance() = default;
  std::unique_ptr<MappedFile> index_, ids_;
  const uint8_t* records_ = nullptr;
  const char* id_bytes_ = nullptr;
  uint64_t count_ = 0, id_size_ = 0;
  struct Input {
    int64_t first_doc = 0;
    std::string path;
    bool parquet = false;  // its documents are rows, numbered from 0
  };
  std::vector<Input> inputs_;  // ascending first_doc
};

}  // namespace keel::data
