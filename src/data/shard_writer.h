// Writes one split (train or val) of a prepared dataset: token shards and the document index,
// streaming, with xxh3 checksums computed on the way. Not thread-safe: one writer per split, fed
// documents in their final order. Files are complete only after finish().
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "data/shard_format.h"

namespace keel::data {

class SplitWriter {
 public:
  // `token_bytes` 2 or 4; a shard is closed once it holds `shard_tokens` tokens.
  SplitWriter(std::string dir, std::string split, uint32_t token_bytes, int64_t vocab_size,
              uint32_t boundary_id, int64_t shard_tokens);
  ~SplitWriter();
  SplitWriter(const SplitWriter&) = delete;
  SplitWriter& operator=(const SplitWriter&) = delete;

  // Appends the document's tokens and one boundary token, and its index record.
  void add_document(std::span<const uint32_t> tokens, uint64_t doc_id, uint32_t cluster);
  // Appends `n` boundary tokens that belong to no document (used to start a document at a window
  // boundary when it is to be kept whole).
  void add_fill(int64_t n);
  int64_t tokens() const { return total_tokens_; }
  int64_t documents() const { return documents_; }
  // Closes every file; returns this split's entry of meta.json:
  // {shards: [{file, tokens, xxh3}], index: {file, records, xxh3}, documents, tokens}.
  nlohmann::json finish();

 private:
  void put(uint32_t token);
  void open_shard();
  void close_shard();

  std::string dir_, split_;
  uint32_t token_bytes_;
  int64_t vocab_size_;
  uint32_t boundary_;
  int64_t shard_tokens_;
  std::FILE* shard_ = nullptr;
  std::FILE* index_ = nullptr;
  XXH3_state_t* shard_hash_;
  XXH3_state_t* index_hash_;
  std::vector<uint8_t> buffer_;
  int64_t shard_count_ = 0, in_shard_ = 0, total_tokens_ = 0, documents_ = 0;
  nlohmann::json shards_ = nlohmann::json::array();
  bool finished_ = false;
};

}  // namespace keel::data
