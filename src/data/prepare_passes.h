// The two passes of `keel prepare` (prepare.h), each a stage of its own: pass 1 reads every
// document and decides what is kept (repetition filter, exact and MinHash near dedup) and its
// length; pass 2 reads again, tokenizes what pass 1 and the length filter kept, and packs it into
// the splits' shards. Internal to src/data; prepare.cpp runs them and writes the reports.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/minhash.h"
#include "data/prepare.h"
#include "data/text_filters.h"
#include "data/text_input.h"
#include "data/tokenizer.h"

namespace keel::data {

class SourceWriter;
class SplitWriter;

// What pass 1 decided for a document.
enum DocumentStatus : uint8_t {
  kKept = 0,
  kExactDup = 1,
  kNearDup = 2,
  kRepeated = 3,
  kOneChar = 4,
  kTooLong = 5  // past kMaxDocumentBytes (text_input.h): never held whole
};

// Pass 1's decisions, by document (in input order, the id pass 2 and the shards use).
struct DedupResult {
  std::vector<uint8_t> status;                 // DocumentStatus
  std::vector<int64_t> lengths;                // bytes
  std::vector<uint32_t> clusters;              // --cluster's id of each document
  std::vector<int64_t> file_first, file_docs;  // per input file: first document id, documents
  int64_t exact_dups = 0, near_dups = 0, repeated = 0, one_char = 0, too_long = 0;
  int64_t bytes_in = 0, invalid = 0, candidates_checked = 0;
  std::string first_invalid;
  std::vector<int64_t> invalid_records;  // their positions among the records read (ReaderStats)
  size_t spm_bytes = 0;                  // text written for spm-train
  nlohmann::json sources;  // meta.json's "sources": the provenance files (data/provenance.h)

  // The lengths of the documents dedup kept, for the length filter.
  std::vector<int64_t> kept_lengths() const;
};

// What pass 1 computes of a document before deciding anything: on any thread, and (for --task) kept
// in a part for the merge to decide on.
struct DocumentFeatures {
  uint8_t verdict = kKept;  // kTooLong, or the repetition filter's: kKept, kRepeated or kOneChar
  uint64_t hash = 0;        // normalized_hash of the text; 0 when the verdict removed it
  std::vector<uint32_t> signature;  // MinHash, when near dedup or --cluster minhash wants it and
                                    // the text has shingles; else empty
};

// o.minhash with the prepare's seed.
MinHashConfig seeded_minhash(const PrepareOptions& o);

class DatatroveMinHasher;
class DatatroveClusters;

// A document's MinHash signature under o.minhash's scheme, as signature_words(o.minhash) words.
class DocumentSigner {
 public:
  explicit DocumentSigner(const PrepareOptions& o);
  ~DocumentSigner();
  // `text` as read and `norm` its normalize_text; empty when the text has no shingle.
  std::vector<uint32_t> sign(std::string_view text, std::string_view norm) const;

 private:
  const MinHashConfig config_;
  std::unique_ptr<MinHasher> keel_;
  std::unique_ptr<DatatroveMinHasher> datatrove_;
};

// The features of a block of documents, computed on `threads` threads.
void compute_features(const PrepareOptions& o, const DocumentSigner& signer,
                      const std::vector<Document>& block, int threads,
                      std::vector<DocumentFeatures>& out);

// Pass 1's decisions, one document at a time in corpus order (deterministic: the same for any
// thread count and for a merge of parts): exact duplicates by hash, then near duplicates by
// MinHash against the documents kept so far. Records every document's provenance into o.output.
// Under datatrove's scheme the near duplicates are decided over the whole corpus in finish(), so
// decide() returns kKept for a document finish() may then mark kNearDup.
class DedupDecider {
 public:
  DedupDecider(const PrepareOptions& o, DedupResult& r, size_t files);
  ~DedupDecider();
  // The status of the next document (its id is the number decided before it); moves the signature
  // of a kept document into the index.
  uint8_t decide(int64_t file, int64_t length, int64_t line, std::string_view id,
                 DocumentFeatures& features);
  // Fills r.candidates_checked and r.sources; call once, after the last document.
  void finish();

 private:
  uint32_t cluster_of(int64_t file, const DocumentFeatures& f) const;
  const PrepareOptions& o_;
  DedupResult& r_;
  std::unique_ptr<NearDuplicateIndex> near_;
  std::unique_ptr<DatatroveClusters> clusters_;
  std::unique_ptr<SourceWriter> sources_;
  std::unordered_set<uint64_t> exact_seen_;
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

// Where pass 2 puts a kept document: its split (a seeded hash of its id), a window boundary first
// for a tenth of those that fit a window (--keep-whole), its cluster; writes o.output's shards.
class Packer {
 public:
  Packer(const PrepareOptions& o, const Tokenizer& tokenizer, PackResult& r);
  ~Packer();
  void add(uint64_t id, std::span<const uint32_t> tokens, uint32_t cluster);
  void finish();

 private:
  const PrepareOptions& o_;
  PackResult& r_;
  std::map<std::string, std::unique_ptr<SplitWriter>> writers_;
};

// Pass 2: the documents `dedup` kept and `length_filter` keeps, tokenized and packed (Packer).
PackResult pack_pass(const PrepareOptions& o, const std::vector<InputFile>& files,
                     const DedupResult& dedup, const LengthFilter& length_filter,
                     const Tokenizer& tokenizer, int threads);

// What a pass's reading counted.
struct ReaderStats {
  int64_t bytes = 0, invalid = 0;  // bytes of text read; JSONL records skipped as invalid
  std::string first_invalid;
  std::vector<int64_t> invalid_records;  // the invalid JSONL records' positions among all read
};

// What a second pass over the same files knows from the first: which records were invalid (its
// ReaderStats::invalid_records), and which documents it needs parsed (by document id); the rest
// reach its stages unparsed (Document::json_record).
struct ParsePlan {
  const std::vector<int64_t>* invalid_records;
  std::function<bool(int64_t)> wanted;
};

// A block of documents between the two stages of pipeline_blocks, with what its parallel stage
// computed for its serial stage.
struct Block {
  std::vector<Document> docs;
  int64_t first_id = 0;  // the id of docs[0]: documents before it in the input
  int64_t bytes = 0;     // input bytes read up to its end
  std::vector<DocumentFeatures> features;
  std::vector<std::vector<uint32_t>> tokens;
};
// The blocks of `files`, each through parallel_stage (on up to `threads` threads; it may call
// parallel_for) and then serial_stage, in input order; a block's parallel stage runs beside the
// previous block's serial stage, so the serial work (the dedup decisions, the packing) is hidden
// behind the parallel work.
ReaderStats pipeline_blocks(const std::vector<InputFile>& files, const InputOptions& input,
                            int threads, const std::function<void(Block&)>& parallel_stage,
                            const std::function<void(Block&)>& serial_stage,
                            const ParsePlan* plan = nullptr);

int worker_threads(const PrepareOptions& o);  // o.threads, or every core
double cpu_seconds();                         // of this process so far

// Runs fn(i) for i in [0, n) on up to `threads` threads.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn);
// Tokenizes `doc` of `files`; a DataError of the tokenizer's (a regex that gives up on the text)
// comes back naming the document: its file and line (parquet: row) and id.
void encode_document(const Tokenizer& tokenizer, const Document& doc,
                     const std::vector<InputFile>& files, std::vector<uint32_t>& out);

// What prepare.cpp shares with a merge of parts (prepare_parts.cpp): the tokenizer of the
// dataset, made (and its model file copied) into o.output, and the reports and meta.json
// written last.
std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& o, const std::string& spm_text,
                                          int threads);
struct PrepareTiming {
  double seconds = 0, cpu_seconds = 0;
  int threads = 1;
};
nlohmann::json write_reports_and_meta(const PrepareOptions& o, const std::vector<InputFile>& files,
                                      const std::vector<std::string>& skipped,
                                      const DedupResult& dedup, const LengthFilter& length_filter,
                                      const PackResult& packed, const Tokenizer& tokenizer,
                                      const PrepareTiming& timing,
                                      const nlohmann::json& extra_meta = nullptr);

// Bytes per token of a dataset whose tokenizer has `vocab_size` ids: uint16 up to 65,536, else
// uint32 (the shards, and a split prepare's parts).
inline uint32_t token_bytes_for(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// Whether `path` is `dir` or lies below it, both resolved (absolute, symlinks followed).
bool lies_inside(const std::filesystem::path& path, const std::filesystem::path& dir);

// Validates the options every prepare shares (DataError naming the flag).
void check_prepare_options(const PrepareOptions& o);

// Writes a dataset (or a part) into a staging directory beside `output` and renames it onto
// `output` at the end (swapping out what --overwrite replaces); `write` gets the staging options.
// The inputs may not lie inside `output`.
nlohmann::json write_staged(const PrepareOptions& o, const std::vector<InputFile>& files,
                            const std::function<nlohmann::json(const PrepareOptions&)>& write);

}  // namespace keel::data
