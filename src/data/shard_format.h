// The on-disk layout of a prepared dataset (the output of `keel prepare`), shared by the writer,
// the reader and the fuzz target. A dataset directory holds:
//
//   meta.json              format, version, tokenizer, vocab size, token dtype, counts, checksums,
//                          the prepare command; written last (tmp + rename), so a directory without
//                          it is an unfinished prepare and is refused
//   report.json, report.txt  what prepare read, removed and wrote (see prepare.h)
//   <split>_NNNNN.bin      token shards: a 64-byte FileHeader, then `count` little-endian tokens of
//                          `elem_bytes` (2 = uint16, 4 = uint32) each
//   <split>.idx            the document index: a FileHeader, then `count` IndexRecords
//   tokenizer.model        the SentencePiece model, when one was used
//   sources.idx, sources.ids  every input document's file line and id field (data/provenance.h)
//
// A split (train, val) is one token stream across its shards, in order: every kept document's
// tokens followed by one boundary token (the tokenizer's end-of-document id), so a training window
// that crosses a document join always sees the boundary. Training windows are cut from the stream
// at load time: window w holds tokens [w*T, w*T + T + 1) for sequence length T.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::data {

inline constexpr char kShardMagic[8] = {'K', 'E', 'E', 'L', 'T', 'O', 'K', '\n'};
inline constexpr char kIndexMagic[8] = {'K', 'E', 'E', 'L', 'I', 'D', 'X', '\n'};
inline constexpr uint32_t kShardFormatVersion = 1;
inline constexpr const char* kMetaFormatName = "keel-shards";

// 64 bytes at the head of every shard and index file; all integers little-endian.
struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t elem_bytes;    // shard: bytes per token (2|4); index: sizeof(IndexRecord)
  uint64_t count;         // shard: tokens; index: records
  uint64_t payload_xxh3;  // XXH3_64bits of the bytes after the header
  uint64_t aux;           // shard: the tokenizer's vocab size; index: tokens in the split
  uint8_t reserved[16];   // zero
  uint64_t header_xxh3;   // XXH3_64bits of the 56 bytes before this field
};
static_assert(sizeof(FileHeader) == 64);

// One kept document: where its tokens sit in the split's stream (the boundary token after it is
// not counted in `length`), which input document it was, and its cluster (a hash of its text or
// the input file it came from, see --cluster) that stratified sampling buckets by.
struct IndexRecord {
  uint64_t offset;  // first token, in the split's stream
  uint64_t doc_id;  // ordinal of the document among all inputs (meta.json "inputs" maps to files)
  uint32_t length;  // tokens
  uint32_t cluster;
};
static_assert(sizeof(IndexRecord) == 24);

uint64_t xxh3(const void* data, size_t size);
// A header with magic/version filled in and header_xxh3 computed over the rest.
FileHeader make_header(const char (&magic)[8], uint32_t elem_bytes, uint64_t count,
                       uint64_t payload_xxh3, uint64_t aux);
std::string hex64(uint64_t value);  // 16 lowercase hex digits, as checksums appear in meta.json
std::string shard_file_name(const std::string& split, int64_t shard);  // "train_00003.bin"
std::string index_file_name(const std::string& split);                 // "train.idx"

}  // namespace keel::data
