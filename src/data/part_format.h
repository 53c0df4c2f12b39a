// The files of one part of a split prepare (data/prepare_parts.h describes the layout), shared by
// the task that writes a part (prepare_parts.cpp) and the merge that reads the parts
// (prepare_merge.cpp). Internal to src/data.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/prepare.h"

namespace keel::data {

inline constexpr const char* kPartFormat = "keel-prepare-part";
// 2: options name the MinHash scheme, and a datatrove part stores two words per signature value,
// which a reader of version 1 would take for twice as many values. Version 1 parts (keel's
// scheme) are still read.
inline constexpr int kPartVersion = 2;
inline constexpr char kDocsMagic[8] = {'K', 'E', 'E', 'L', 'P', 'D', 'C', '\n'};
inline constexpr char kSigsMagic[8] = {'K', 'E', 'E', 'L', 'P', 'S', 'G', '\n'};
inline constexpr char kTokensMagic[8] = {'K', 'E', 'E', 'L', 'P', 'T', 'K', '\n'};
inline constexpr char kIdsMagic[8] = {'K', 'E', 'E', 'L', 'P', 'I', 'D', '\n'};

// One document of a part, as the merge needs it to decide and to pack.
struct PartRecord {
  uint32_t file;    // index into the whole input list
  uint8_t verdict;  // the repetition filter's (DocumentStatus)
  uint8_t has_signature;
  uint8_t tokenized;
  uint8_t reserved;
  int64_t length;       // bytes
  int64_t line;         // where it starts (parquet: its row)
  uint64_t hash;        // normalized_hash
  uint64_t id_end;      // ids.bin bytes up to the end of its id
  uint64_t tokens_end;  // tokens.bin tokens up to the end of its tokens
};
static_assert(sizeof(PartRecord) == 48);

struct PayloadFile {
  const char* name;
  const char (&magic)[8];
  uint32_t elem_bytes;
};
// tokens.bin's entries are as wide as the dataset's tokens: 2 bytes up to 65,536 ids, else 4
// (elem_bytes 0 here).
inline constexpr PayloadFile kPayload[] = {{"documents.bin", kDocsMagic, sizeof(PartRecord)},
                                           {"signatures.bin", kSigsMagic, 4},
                                           {"tokens.bin", kTokensMagic, 0},
                                           {"ids.bin", kIdsMagic, 1}};

// Everything that shapes the dataset, as part.json records it, so that every part and the merge
// agree on it; options_from is its inverse, with the part's copy of the tokenizer's file.
nlohmann::json options_json(const PrepareOptions& o);
PrepareOptions options_from(const nlohmann::json& j, const std::filesystem::path& part_dir);

}  // namespace keel::data
