// The two passes of `keel prepare` (prepare.h), each a stage of its own: pass 1 reads every
// document and decides what is kept (repetition filter, exact and MinHash near dedup) and its
// length; pass 2 reads again, tokenizes what pass 1 and the length filter kept, and packs it into
// the splits' shards. Internal to src/data; prepare.cpp runs them and writes the reports.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/prepare.h"
#include "data/text_filters.h"
#include "data/text_input.h"
#include "data/tokenizer.h"

namespace keel::data {

// What pass 1 decided for a document.
enum DocumentStatus : uint8_t {
  kKept = 0,
  kExactDup = 1,
  kNearDup = 2,
  kRepeated = 3,
  kOneChar = 4
};

// Pass 1's decisions, by document (in input order, the id pass 2 and the shards use).
struct DedupResult {
  std::vector<uint8_t> status;                 // DocumentStatus
  std::vector<int64_t> lengths;                // bytes
  std::vector<uint32_t> clusters;              // --cluster's id of each document
  std::vector<int64_t> file_first, file_docs;  // per input file: first document id, documents
  int64_t exact_dups = 0, near_dups = 0, repeated = 0, one_char = 0;
  int64_t bytes_in = 0, invalid = 0, candidates_checked = 0;
  std::string first_invalid;
  size_t spm_bytes = 0;    // text written for spm-train
  nlohmann::json sources;  // meta.json's "sources": the provenance files (data/provenance.h)

  // The lengths of the documents dedup kept, for the length filter.
  std::vector<int64_t> kept_lengths() const;
};

// Pass 1 over `files` on `threads` threads; decisions in corpus order, the same for any thread
// count. Writes every document's provenance (data/provenance.h) into o.output. With `spm_text_path`
// non-empty, the kept documents' non-blank lines go there (at most kSpmTrainBytes) for training a
// SentencePiece model.
DedupResult dedup_pass(const PrepareOptions& o, const std::vector<InputFile>& files, int threads,
                       const std::string& spm_text_path);
inline constexpr size_t kSpmTrainBytes = size_t{64} << 20;

// What pass 2 wrote.
struct PackResult {
  nlohmann::json splits;  // per split: its writer's summary, plus "windows" of seq_len
  int64_t fill_tokens = 0, whole_docs = 0, long_docs = 0, docs_out = 0, tokens_out = 0;
  std::unordered_map<uint32_t, int64_t> cluster_docs;  // documents written per cluster id
};

// Pass 2: the documents `dedup` kept and `length_filter` keeps, tokenized, each with its split (a
// seeded hash of its id), its cluster (pass 1's, --cluster) and, for a tenth of those that fit a
// window
// (--keep-whole), a start on a window boundary; written as o.output's shards.
PackResult pack_pass(const PrepareOptions& o, const std::vector<InputFile>& files,
                     const DedupResult& dedup, const LengthFilter& length_filter,
                     const Tokenizer& tokenizer, int threads);

}  // namespace keel::data
