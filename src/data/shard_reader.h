// Opens a prepared dataset strictly: meta.json, every shard and the document index are checked
// (magic, version, sizes, counts, xxh3 checksums, token range, index consistency) before a single
// token is served. Anything wrong throws keel::DataError (exit 2) naming the file and the problem,
// with a HINT; malformed input never crashes the reader (tests/fuzz/shard_reader_fuzz.cpp).
// Shards are memory-mapped read-only; a ShardSet is immutable after open() and safe to read from
// many threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "data/shard_format.h"

namespace keel::data {

struct ShardEntry {
  std::string file;
  int64_t tokens = 0;
  uint64_t xxh3 = 0;
};

struct SplitMeta {
  std::vector<ShardEntry> shards;
  std::string index_file;
  int64_t records = 0;
  uint64_t index_xxh3 = 0;
  int64_t tokens = 0;
};

struct DatasetMeta {
  int64_t vocab_size = 0;
  uint32_t token_bytes = 2;
  uint32_t boundary_id = 0;
  int64_t seq_len = 0;        // the sequence length prepare packed for (0 = unknown)
  nlohmann::json tokenizer;   // {kind: byte|spm, model: file, ...}
  nlohmann::json provenance;  // {inputs, sources} of meta.json, as written (data/provenance.h)
  std::map<std::string, SplitMeta> splits;
};

// Parses and checks meta.json's text; `path` names it in errors.
DatasetMeta parse_meta(std::string_view text, const std::string& path);

// The checks open() applies to one file, over bytes in memory (the fuzz target's entry points).
// `expect` comes from meta.json; each throws DataError naming `path` when the bytes disagree.
FileHeader check_shard_bytes(const uint8_t* data, size_t size, const std::string& path,
                             const ShardEntry& expect, uint32_t token_bytes, int64_t vocab_size);
std::vector<IndexRecord> check_index_bytes(const uint8_t* data, size_t size,
                                           const std::string& path, const SplitMeta& expect);

class MappedFile;

// One stretch of a split's token stream that lies in a mapped file: `tokens` tokens of the meta's
// token_bytes each, from `payload` on. Readers of other formats (data/foreign_formats.h) hand their
// stream over as parts.
struct StreamPart {
  std::shared_ptr<const MappedFile> file;
  std::string name;  // relative to the set's dir(), as shard_at() reports it
  const uint8_t* payload = nullptr;
  int64_t tokens = 0;
};

class ShardSet {
 public:
  // Opens split `split` ("train", "val") of the dataset in `dir`. Throws DataError.
  static std::unique_ptr<ShardSet> open(const std::string& dir, const std::string& split);
  // A split already checked by its reader: `parts` in stream order, `index` sorted by offset.
  static std::unique_ptr<ShardSet> from_parts(std::string dir, std::string split, DatasetMeta meta,
                                              std::vector<StreamPart> parts,
                                              std::vector<IndexRecord> index);
  ~ShardSet();
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  const DatasetMeta& meta() const { return meta_; }
  const std::string& dir() const { return dir_; }
  int64_t num_tokens() const { return total_tokens_; }
  const std::vector<IndexRecord>& documents() const { return index_; }
  // Copies tokens [start, start+count) of the split's stream (across shard boundaries) to `out`.
  void read(int64_t start, int64_t count, int64_t* out) const;
  // The document whose tokens (or trailing boundary) contain stream position `pos`; -1 before
  // the first document.
  int64_t document_at(int64_t pos) const;
  // Where stream position `pos` lives: the shard file (relative to dir()) and the token offset
  // inside it, so a person can find a sample in the data.
  std::pair<std::string, int64_t> shard_at(int64_t pos) const;

 private:
  ShardSet() = default;
  std::string dir_;
  std::string split_;
  DatasetMeta meta_;
  std::vector<std::shared_ptr<const MappedFile>> files_;
  std::vector<const uint8_t*> payloads_;
  std::vector<int64_t> starts_;  // first stream position of each shard, plus the total at the end
  std::vector<IndexRecord> index_;
  int64_t total_tokens_ = 0;
};

// Reads and checks DIR/meta.json only. Throws DataError.
DatasetMeta read_meta(const std::string& dir);
// The vocabulary size recorded in DIR/meta.json (for `keel validate`). Throws DataError.
int64_t shard_vocab_size(const std::string& dir);

}  // namespace keel::data
