// Pre-tokenized corpora read in place, served as a ShardSet (shard_reader.h) with every guarantee
// of keel's own shards downstream (backpressure, the consumed-vs-steps count, the stratified order
// by document, quarantine naming file and offset, resume at any layout):
//   megatron  Megatron-LM's MMIDIDX pair PREFIX.bin / PREFIX.idx; data.path is PREFIX (or either
//             file). Header: "MMIDIDX\0\0", u64 version 1, u8 dtype (8 uint16, 4 int32), u64
//             sequences, u64 document-index entries; then int32 sizes, int64 byte pointers and
//             int64 document indices (0, ..., sequences). Documents come from that index.
//   llmc      llm.c's .bin shards; data.path is a file, a directory (its *.bin, in name order) or a
//             glob pattern. A 256 x int32 header (magic 20240520 with version 1 for uint16
//             tokens, 20240801 with version 7 for uint32; then the token count), then the
//             tokens. llm.c's writers put <|endoftext|> (or <|begin_of_text|>) before every
//             document, so a document runs from one occurrence of the token that opens the first
//             shard to the next.
// Every header, size, pointer and index entry is checked, and every token against the model's
// vocabulary, before a token is served; anything inconsistent throws DataError (exit 2) naming the
// file and the byte. Neither format stores checksums of its tokens: a flipped token byte is caught
// only when it leaves the vocabulary.
//
// Splits. A format holds one stream. With a held-out share h > 0, "train" is the stream less its
// last max(1, round(h x documents)) documents and "val" is those (Megatron's split by contiguous
// ranges); with h = 0, "train" is the whole stream (the val source being another path).
// Documents are indexed as keel's own are (offset, length without the boundary token, ordinal,
// cluster): a Megatron document's last token and an llm.c document's delimiter are its boundary.
// The cluster, for the stratified order, is the low 32 bits of XXH3-64 over the document's ids as
// little-endian int64: a Megatron document's whole (end token included), an llm.c document's after
// its delimiter. Documents with nothing besides the boundary are not indexed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/schema.h"
#include "data/shard_reader.h"

namespace keel::data {

// The share of documents held out for validation when data.val_path is empty (as keel prepare's
// default --val-fraction).
inline constexpr double kForeignHeldOutShare = 0.02;

struct MegatronIndex {
  uint32_t token_bytes = 2;         // 2 (uint16) or 4 (int32)
  int64_t tokens = 0;               // the .bin must hold exactly tokens * token_bytes bytes
  std::vector<int64_t> doc_starts;  // document k holds tokens [doc_starts[k], doc_starts[k+1])
};
// Checks and reads a .idx file's bytes; `path` names it in errors.
MegatronIndex parse_megatron_index(const uint8_t* data, size_t size, const std::string& path);

struct LlmcHeader {
  uint32_t token_bytes = 2;
  int64_t tokens = 0;
};
// Checks an llm.c shard's header against its size.
LlmcHeader parse_llmc_header(const uint8_t* data, size_t size, const std::string& path);

// The shard files data.path names for llmc: a file, a directory's *.bin, or a glob pattern.
std::vector<std::string> llmc_files(const std::string& path);
// PREFIX for data.path PREFIX, PREFIX.bin or PREFIX.idx.
std::string megatron_prefix(const std::string& path);

struct ForeignSource {
  config::DataSource format = config::DataSource::kMegatron;
  std::string path;
  std::string split = "train";  // "train" or "val"
  double held_out = 0.0;        // share of documents that is "val" (0: none)
  int64_t vocab_size = 0;       // the model's: every token must be below it
};
// Opens and checks the source, then its split. Throws DataError.
std::unique_ptr<ShardSet> open_foreign(const ForeignSource& source);

// What the headers and index say, without reading the tokens (for `keel validate`): files,
// tokens, documents (llmc: unknown until the tokens are read, -1). Throws DataError.
struct ForeignSummary {
  int64_t files = 0, tokens = 0, documents = -1;
  uint32_t token_bytes = 2;
};
ForeignSummary summarize_foreign(config::DataSource format, const std::string& path);

}  // namespace keel::data
