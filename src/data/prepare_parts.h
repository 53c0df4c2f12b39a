// `keel prepare` over many machines: `--task I --tasks N` runs the expensive per-document work
// (read, repetition filter, hash, MinHash, tokenize) over its share of the input files and writes
// it as a part; `--merge` then makes the decisions that need the whole corpus (exact and near
// dedup in corpus order, the length filter's percentile tails) over all parts and writes the
// dataset. The dataset is the one a single `keel prepare` over the same inputs and options writes:
// the same shards, indexes and provenance, byte for byte (meta.json differs only in the command).
//
// A task's share is a contiguous run of the sorted input files, balanced by bytes, so corpus order
// is part 0's documents, then part 1's, ... Each part is a directory PARTS/part-0000I-of-0000N:
//   part.json       the task, the whole input list with sizes, the options, the tokenizer, counts
//                   and the files' checksums
//   documents.bin   a FileHeader (magic KEELPDC), then per document a PartRecord
//   signatures.bin  (KEELPSG) the MinHash signatures of the documents that have one, num_perm each
//   tokens.bin      (KEELPTK) tokens (uint16, or uint32 past 65,536 ids) of the documents the
//                   task tokenized: every one that passed the repetition filter and the hard length
//                   bounds and is not an exact duplicate of an earlier document of its own part
//                   (those stay out whatever the merge decides); a near duplicate is tokenized,
//                   since the document it resembles may be removed by the merge
//   ids.bin         (KEELPID) the records' own ids (provenance), back to back
//   tokenizer.model / tokenizer.json   the tokenizer's file, when it has one
// Every part is written under a temporary name and renamed into place, so the merge sees whole
// parts only; it refuses a missing part, a part from other inputs or options, and a corrupt file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "data/prepare.h"

namespace keel::data {

// Writes part `task` of `tasks` into o.output (a directory of parts; created). DataError (exit 2)
// for bad options or inputs, and for --tokenizer spm-train, which needs the whole corpus: train the
// model once, then give spm:MODEL to every task. Returns the part's part.json.
nlohmann::json prepare_part(const PrepareOptions& o, int task, int tasks);

// Merges the parts in `parts_dir` into the dataset o.output (o.output, o.overwrite, o.threads,
// o.command and o.on_progress are used; everything else comes from the parts). Returns the
// dataset's report.json.
nlohmann::json merge_parts(const std::string& parts_dir, const PrepareOptions& o);

// "part-00001-of-00003"
std::string part_name(int task, int tasks);

}  // namespace keel::data
