// `keel prepare`: raw text -> a dataset directory the loader can train on (format: shard_format.h).
//
// Two streaming passes over the inputs, so a corpus larger than memory works (memory grows with
// the number of documents — a hash, a length and, for kept documents, a MinHash signature — never
// with their text):
//   1. read documents; in parallel compute length, normalised hash and MinHash signature; then, in
//      corpus order (deterministic for any thread count), drop exact duplicates (same normalised
//      hash) and near duplicates (LSH candidate with estimated Jaccard >= threshold); then fit the
//      length filter (hard bounds + percentile tails) to the surviving lengths.
//   2. read again; tokenize the kept documents in parallel; append them, each followed by the
//      boundary token, to the train or val split (a seeded hash of the document decides).
// meta.json is written last, atomically; report.json and report.txt say what each stage removed.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/minhash.h"
#include "data/text_filters.h"
#include "data/text_input.h"

namespace keel::data {

// Where a prepare is, after each block of documents: for a progress line.
struct PrepareProgress {
  int pass = 1;             // 1: dedup and filters; 2: tokenize and write
  int64_t documents = 0;    // read in this pass
  int64_t bytes_read = 0;   // of text, decompressed, in this pass
  int64_t bytes_total = 0;  // the pass's total when known (pass 2: pass 1's count), else 0
  int64_t tokens_out = 0;   // written so far (pass 2)
  double seconds = 0;       // since the pass started
};

// --tokenizer: byte, spm:MODEL (an existing SentencePiece model), spm-train:VOCAB (train one of
// that vocabulary on the kept documents) or hf:FILE (a Hugging Face tokenizer.json with a BPE
// model; see data/hf_bpe.h).
struct TokenizerSpec {
  enum class Kind { kByte, kSpm, kSpmTrain, kHf };
  Kind kind = Kind::kByte;
  std::string model;         // kSpm, kHf: the model file
  int64_t vocab = 0;         // kSpmTrain: at least 8
  std::string text() const;  // as given on the command line
  // DataError (exit 2) naming --tokenizer and what is valid.
  static TokenizerSpec parse(const std::string& spec);
};

// --cluster: the stratified sampler's cluster of a document.
enum class ClusterBy {
  kMinHash,  // the first value of its MinHash signature: two documents share it with probability
             // their shingles' Jaccard similarity, so similar documents share a cluster
  kHash,     // a hash of its text (unrelated documents and similar ones alike spread at random)
  kSource,   // its input file (a named source)
};

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, directories, globs
  std::string output;               // dataset directory (created; must be empty unless overwrite)
  bool overwrite = false;           // replace a non-empty output (swapped in whole at the end)
  TokenizerSpec tokenizer;
  InputOptions input;
  bool exact_dedup = true;
  bool near_dedup = true;
  MinHashConfig minhash;
  LengthRules length;
  RepetitionRules repetition;
  double val_fraction = 0.0;  // share of kept documents in the val split
  int64_t seq_len = 1024;     // training window the data is packed for
  double keep_whole = 0.0;    // share of documents that fit a window started on a window
                              // boundary (the gap filled with boundary tokens), not split
  ClusterBy cluster = ClusterBy::kMinHash;
  int64_t shard_tokens = int64_t{1} << 27;
  int threads = 0;  // 0 = hardware concurrency
  uint64_t seed = 1234;
  std::string command;  // the command line, recorded in meta.json
  // Called after every block of documents, from the calling thread; may be empty.
  std::function<void(const PrepareProgress&)> on_progress;
};

// What `keel prepare` does unless told otherwise, following the seed: a val split (2 % of the
// documents), length-tail filtering (the shortest and longest 0.5 %), the repetition filter
// (more than 40 % of the bytes repeated spans, or one character over half of the text), and 10 %
// of the documents
// that fit a window kept whole (started on a window boundary behind boundary tokens) instead of
// split. Each is turned off with 0 (--val-fraction 0, --drop-percentile-tails 0,
// --max-repeated-share 0, --max-top-char-share 0, --keep-whole 0).
// A default-constructed PrepareOptions does none of these (the library's plain form).
PrepareOptions recommended_prepare_options();

// DataError (exit 2) naming what is there when `output` is a non-empty directory and `overwrite`
// is false, or exists and is not a directory. Reads only.
void check_prepare_output(const std::string& output, bool overwrite);

// Runs the pipeline; returns report.json's content (also written to OUTPUT/report.json).
// Throws DataError for unusable inputs or options, before anything is written. The dataset is
// written into OUTPUT.tmp-<pid> beside OUTPUT and renamed (or, over an existing dataset, swapped)
// into place at the end: OUTPUT holds the old dataset or the new one, never a mix.
nlohmann::json prepare(const PrepareOptions& options);

}  // namespace keel::data
