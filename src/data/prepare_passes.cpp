#include "data/prepare_passes.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_set>

#include "common/error.h"
#include "data/datatrove_minhash.h"
#include "data/minhash.h"
#include "data/provenance.h"
#include "data/shard_format.h"
#include "data/shard_writer.h"

namespace keel::data {
namespace fs = std::filesystem;
namespace {

constexpr size_t kBlockDocs = 2048;
constexpr size_t kBlockBytes = size_t{32} << 20;
using SteadyClock = std::chrono::steady_clock;

// Reads documents in blocks (bounded by count and bytes), so memory stays flat.
bool read_block(DocumentReader& reader, std::vector<Document>& block) {
  block.clear();
  size_t bytes = 0;
  Document doc;
  while (block.size() < kBlockDocs && bytes < kBlockBytes && reader.next(doc)) {
    bytes += doc.text.size();
    block.push_back(std::move(doc));
    doc = Document();
  }
  return !block.empty();
}

uint64_t mix(uint64_t seed, uint64_t x) {
  uint64_t v[2] = {seed, x};
  return xxh3(v, sizeof v);
}
double unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// Runs `produce` on a thread of its own, up to `depth` items ahead of the thread that takes them
// (pop()), in the order produced. The producer's exception reaches pop() after the items made
// before it. Stopping early (the destructor) lets a producer blocked on a full queue return.
template <class T>
class Ahead {
 public:
  Ahead(std::function<bool(T&)> produce, size_t depth)
      : produce_(std::move(produce)), depth_(depth) {
    thread_ = std::thread([this] { run(); });
  }
  ~Ahead() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  Ahead(const Ahead&) = delete;
  Ahead& operator=(const Ahead&) = delete;

  // The next item; false once the producer is done and every item taken.
  bool pop(T& out) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return !queue_.empty() || done_; });
    if (queue_.empty()) {
      if (error_) std::rethrow_exception(error_);
      return false;
    }
    out = std::move(queue_.front());
    queue_.pop_front();
    changed_.notify_all();
    return true;
  }

 private:
  void run() {
    try {
      T item{};
      while (produce_(item)) {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return queue_.size() < depth_ || stopping_; });
        if (stopping_) break;
        queue_.push_back(std::move(item));
        item = T{};
        changed_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    changed_.notify_all();
  }

  std::function<bool(T&)> produce_;
  size_t depth_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<T> queue_;
  bool done_ = false, stopping_ = false;
  std::exception_ptr error_;
};

// The blocks of a pass in input order, read one ahead on a thread of its own (with more than one
// worker), so that reading the input overlaps the workers' work.
class BlockReader {
 public:
  BlockReader(DocumentReader& reader, bool ahead) : reader_(reader) {
    if (ahead)
      ahead_ = std::make_unique<Ahead<RawBlock>>(
          [this](RawBlock& b) {
            if (!read_block(reader_, b.docs)) return false;
            b.bytes = reader_.bytes_read();
            return true;
          },
          kAhead);
  }
  BlockReader(const BlockReader&) = delete;
  BlockReader& operator=(const BlockReader&) = delete;

  // The next block and the input bytes read up to its end; false at the end of the input. An
  // error of the reader is thrown here, after the blocks read before it.
  bool next(std::vector<Document>& block, int64_t& bytes) {
    if (!ahead_) {
      const bool any = read_block(reader_, block);
      bytes = reader_.bytes_read();
      return any;
    }
    RawBlock b;
    if (!ahead_->pop(b)) return false;
    block = std::move(b.docs);
    bytes = b.bytes;
    return true;
  }
  // Stops and joins the thread; the DocumentReader is the caller's again.
  void finish() { ahead_.reset(); }

 private:
  struct RawBlock {
    std::vector<Document> docs;
    int64_t bytes = 0;
  };
  static constexpr size_t kAhead = 2;
  DocumentReader& reader_;
  std::unique_ptr<Ahead<RawBlock>> ahead_;
};

void report_progress(const PrepareOptions& o, int pass, int64_t bytes_read, int64_t documents,
                     int64_t total, int64_t tokens_out, SteadyClock::time_point start) {
  if (!o.on_progress) return;
  PrepareProgress p;
  p.pass = pass;
  p.documents = documents;
  p.bytes_read = bytes_read;
  p.bytes_total = total;
  p.tokens_out = tokens_out;
  p.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  o.on_progress(p);
}

// Plain-text inputs are read byte for byte, so their sizes are pass 1's total; a compressed
// input's text size is only known once read (0: unknown).
int64_t plain_text_bytes(const std::vector<InputFile>& files) {
  int64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f.path, ec);
    const auto ext = fs::path(f.path).extension().string();
    if (ec || ext == ".gz" || ext == ".zst" || f.parquet) return 0;
    total += static_cast<int64_t>(size);
  }
  return total;
}

// A kept document's non-blank lines, for spm-train.
void sample_for_spm(std::string_view text, std::ofstream& out, size_t& bytes) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    auto line = text.substr(start, end - start);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
      out << line << '\n';
      bytes += line.size() + 1;
    }
    start = end + 1;
  }
}

// A document's text in the SentencePiece sample: bytes [begin, end) of the sample file.
struct SpmSample {
  int64_t doc;
  size_t begin, end;
};

// Under datatrove's scheme the near duplicates are known only after the last document: the sample
// is written again without those it took before.
void drop_removed_from_sample(const std::string& path, const std::vector<SpmSample>& samples,
                              const std::vector<uint8_t>& status, size_t& bytes) {
  if (std::all_of(samples.begin(), samples.end(),
                  [&](const SpmSample& s) { return status[s.doc] == kKept; }))
    return;
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  bytes = 0;
  for (const SpmSample& s : samples) {
    if (status[s.doc] != kKept) continue;
    out.write(text.data() + s.begin, static_cast<std::streamsize>(s.end - s.begin));
    bytes += s.end - s.begin;
  }
}

}  // namespace

std::vector<int64_t> DedupResult::kept_lengths() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < status.size(); ++i)
    if (status[i] == kKept) out.push_back(lengths[i]);
  return out;
}

int worker_threads(const PrepareOptions& o) {
  return o.threads > 0 ? o.threads
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

void parallel_for(size_t n, int threads, const std::function<void(size_t)>& fn) {
  const int t = static_cast<int>(std::min<size_t>(n, std::max(threads, 1)));
  if (t <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // A worker's exception ends the others' work and is thrown here (escaping a thread, it aborts).
  std::atomic<size_t> next{0};
  std::exception_ptr failed;
  std::mutex failed_mutex;
  std::vector<std::thread> pool;
  for (int k = 0; k < t; ++k)
    pool.emplace_back([&] {
      try {
        for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
      } catch (...) {
        next = n;
        if (std::lock_guard<std::mutex> lock(failed_mutex); !failed)
          failed = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  if (failed) std::rethrow_exception(failed);
}

namespace {

// A raw block's JSONL records parsed on the workers (parsing is a fifth of a prepare's work, and
// one reading thread doing it bounded every other); the invalid ones dropped and counted, in order,
// their positions among the records read (from `raw0` on) noted. With a plan (a second pass), the
// records the first pass found invalid are dropped unparsed and only the wanted documents parsed.
void parse_block(std::vector<Document>& docs, int64_t raw0, const std::vector<InputFile>& files,
                 const InputOptions& input, int threads, const ParsePlan* plan,
                 ReaderStats& parsed) {
  std::vector<uint8_t> valid(docs.size(), 1), parse(docs.size(), 1);
  if (plan) {
    const auto& invalid = *plan->invalid_records;
    auto next_invalid = std::lower_bound(invalid.begin(), invalid.end(), raw0);
    int64_t id = raw0 - (next_invalid - invalid.begin());
    for (size_t i = 0; i < docs.size(); ++i) {
      const int64_t raw = raw0 + static_cast<int64_t>(i);
      if (next_invalid != invalid.end() && *next_invalid == raw) {
        valid[i] = parse[i] = 0;
        ++next_invalid;
      } else {
        parse[i] = plan->wanted(id++);
      }
    }
  }
  std::vector<std::string> why(docs.size());
  parallel_for(docs.size(), threads, [&](size_t i) {
    Document& d = docs[i];
    if (d.json_record && parse[i])
      valid[i] = parse_json_record(d, input, files[d.file].path, &why[i]);
  });
  size_t kept = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (!valid[i]) {
      if (!plan) {
        parsed.invalid_records.push_back(raw0 + static_cast<int64_t>(i));
        if (parsed.invalid++ == 0) parsed.first_invalid = std::move(why[i]);
      }
      continue;
    }
    if (kept != i) docs[kept] = std::move(docs[i]);
    ++kept;
  }
  docs.resize(kept);
}

// pipeline_blocks with more than one thread: a thread of its own prepares the blocks (their
// parallel stage on the workers) up to two ahead, while the calling thread runs their serial
// stages in order; neither waits for the other but when the queue is full or empty.
void run_prepared_ahead(BlockReader& blocks, const std::function<void(Block&)>& prepare,
                        const std::function<void(Block&)>& serial_stage) {
  int64_t first_id = 0;
  Ahead<Block> prepared(
      [&](Block& b) {
        if (!blocks.next(b.docs, b.bytes)) return false;
        b.first_id = first_id;
        prepare(b);
        first_id += static_cast<int64_t>(b.docs.size());
        return true;
      },
      /*depth=*/2);
  for (Block b; prepared.pop(b);) serial_stage(b);
}

}  // namespace

ReaderStats pipeline_blocks(const std::vector<InputFile>& files, const InputOptions& input,
                            int threads, const std::function<void(Block&)>& parallel_stage,
                            const std::function<void(Block&)>& serial_stage,
                            const ParsePlan* plan) {
  DocumentReader reader(files, input, /*defer_json=*/true);
  BlockReader blocks(reader, threads > 1);
  ReaderStats parsed;
  int64_t raw = 0;  // records read before the block being prepared
  auto prepare = [&](Block& b) {
    const int64_t raw0 = raw;
    raw += static_cast<int64_t>(b.docs.size());
    parse_block(b.docs, raw0, files, input, threads, plan, parsed);
    parallel_stage(b);
  };
  if (threads <= 1) {
    Block b;
    while (blocks.next(b.docs, b.bytes)) {
      prepare(b);
      serial_stage(b);
      b.first_id += static_cast<int64_t>(b.docs.size());
    }
  } else {
    run_prepared_ahead(blocks, prepare, serial_stage);
  }
  blocks.finish();
  parsed.bytes = reader.bytes_read();
  parsed.invalid += reader.invalid_records();
  if (parsed.first_invalid.empty()) parsed.first_invalid = reader.first_invalid();
  return parsed;
}

// datatrove's scheme ignores the seed: its hash functions are those of MinhashConfig's seed 1.
MinHashConfig seeded_minhash(const PrepareOptions& o) {
  MinHashConfig mh = o.minhash;
  mh.seed = o.seed;
  return mh;
}

DocumentSigner::DocumentSigner(const PrepareOptions& o) : config_(seeded_minhash(o)) {
  if (config_.scheme == MinHashScheme::kDatatrove)
    datatrove_ = std::make_unique<DatatroveMinHasher>(config_.shingle_size, config_.num_perm);
  else
    keel_ = std::make_unique<MinHasher>(config_);
}

DocumentSigner::~DocumentSigner() = default;

std::vector<uint32_t> DocumentSigner::sign(std::string_view text, std::string_view norm) const {
  if (datatrove_) {
    const std::vector<uint64_t> values = datatrove_->signature(text);
    std::vector<uint32_t> words;
    words.reserve(2 * values.size());
    for (uint64_t v : values) {
      words.push_back(static_cast<uint32_t>(v));
      words.push_back(static_cast<uint32_t>(v >> 32));
    }
    return words;
  }
  const auto shingles =
      shingle_set_of_normalized(norm, config_.char_shingles, config_.shingle_size);
  return shingles.empty() ? std::vector<uint32_t>{} : keel_->signature(shingles);
}

void compute_features(const PrepareOptions& o, const DocumentSigner& signer,
                      const std::vector<Document>& block, int threads,
                      std::vector<DocumentFeatures>& out) {
  out.assign(block.size(), {});
  const bool sign = o.near_dedup || o.cluster == ClusterBy::kMinHash;
  parallel_for(block.size(), threads, [&](size_t i) {
    DocumentFeatures& f = out[i];
    if (block[i].oversized) {
      f.verdict = kTooLong;
      return;
    }
    const auto why = repetition_verdict(o.repetition, block[i].text);
    if (!why.empty()) {
      f.verdict = why == "one_character" ? kOneChar : kRepeated;
      return;
    }
    const std::string norm = normalize_text(block[i].text);
    f.hash = xxh3(norm.data(), norm.size());  // normalized_hash(text), normalising once
    if (sign) f.signature = signer.sign(block[i].text, norm);
  });
}

DedupDecider::DedupDecider(const PrepareOptions& o, DedupResult& r, size_t files)
    : o_(o), r_(r), sources_(std::make_unique<SourceWriter>(o.output)) {
  if (o.near_dedup && o.minhash.scheme == MinHashScheme::kDatatrove)
    clusters_ =
        std::make_unique<DatatroveClusters>(o.minhash.bands, o.minhash.num_perm / o.minhash.bands);
  else if (o.near_dedup)
    near_ = std::make_unique<NearDuplicateIndex>(seeded_minhash(o));
  r_.file_first.assign(files, -1);
  r_.file_docs.assign(files, 0);
}

DedupDecider::~DedupDecider() = default;

uint8_t DedupDecider::decide(int64_t file, int64_t length, int64_t line, std::string_view id,
                             DocumentFeatures& f) {
  const auto doc = static_cast<int64_t>(r_.status.size());
  if (r_.file_first[file] < 0) r_.file_first[file] = doc;
  ++r_.file_docs[file];
  r_.lengths.push_back(length);
  r_.clusters.push_back(cluster_of(file, f));
  sources_->add(line, id);
  uint8_t s = f.verdict;
  if (s != kKept) {
    ++(s == kTooLong ? r_.too_long : s == kOneChar ? r_.one_char : r_.repeated);
  } else if (o_.exact_dedup && !exact_seen_.insert(f.hash).second) {
    s = kExactDup;
    ++r_.exact_dups;
  } else if (clusters_ && !f.signature.empty()) {
    std::vector<uint64_t> values(f.signature.size() / 2);
    for (size_t k = 0; k < values.size(); ++k)
      values[k] = f.signature[2 * k] | uint64_t{f.signature[2 * k + 1]} << 32;
    clusters_->add(doc, values);
  } else if (near_ && !f.signature.empty()) {
    if (near_->find(f.signature) >= 0) {
      s = kNearDup;
      ++r_.near_dups;
    } else {
      near_->insert(doc, std::move(f.signature));
    }
  }
  r_.status.push_back(s);
  return s;
}

// A document without shingles (or removed before its signature) falls back to its text's hash.
uint32_t DedupDecider::cluster_of(int64_t file, const DocumentFeatures& f) const {
  if (o_.cluster == ClusterBy::kSource) return static_cast<uint32_t>(file);
  if (o_.cluster == ClusterBy::kMinHash && !f.signature.empty()) return f.signature[0];
  return static_cast<uint32_t>(f.hash >> 32);
}

void DedupDecider::finish() {
  r_.candidates_checked = near_ ? near_->candidates_checked() : 0;
  if (clusters_) {
    const std::vector<int64_t> removed = clusters_->removed();
    for (int64_t doc : removed) r_.status[doc] = kNearDup;
    r_.near_dups = static_cast<int64_t>(removed.size());
    r_.candidates_checked = clusters_->pairs();
  }
  r_.sources = sources_->finish();
}

Packer::Packer(const PrepareOptions& o, const Tokenizer& tokenizer, PackResult& r) : o_(o), r_(r) {
  const uint32_t token_bytes = token_bytes_for(tokenizer.vocab_size());
  for (const char* split : {"train", "val"}) {
    if (std::string(split) == "val" && o.val_fraction <= 0) continue;
    writers_[split] =
        std::make_unique<SplitWriter>(o.output, split, token_bytes, tokenizer.vocab_size(),
                                      tokenizer.boundary_id(), o.shard_tokens);
  }
}

Packer::~Packer() = default;

void Packer::add(uint64_t id, std::span<const uint32_t> tokens, uint32_t cluster) {
  const bool val = o_.val_fraction > 0 && unit(mix(o_.seed, id)) < o_.val_fraction;
  SplitWriter& w = *writers_[val ? "val" : "train"];
  const auto len = static_cast<int64_t>(tokens.size());
  if (len + 1 > o_.seq_len + 1) ++r_.long_docs;  // spans windows, with boundary tokens around it
  if (o_.keep_whole > 0 && len <= o_.seq_len && unit(mix(o_.seed ^ 0x5eed, id)) < o_.keep_whole) {
    const int64_t r = w.tokens() % o_.seq_len;
    if (r != 0 && r + len > o_.seq_len) {
      w.add_fill(o_.seq_len - r);
      r_.fill_tokens += o_.seq_len - r;
    }
    ++r_.whole_docs;
  }
  w.add_document(tokens, id, cluster);
  ++r_.cluster_docs[cluster];
  r_.tokens_out += len;
  ++r_.docs_out;
}

void Packer::finish() {
  for (auto& [name, w] : writers_) {
    r_.splits[name] = w->finish();
    const int64_t n = r_.splits[name]["tokens"].get<int64_t>();
    r_.splits[name]["windows"] = n > 1 ? (n - 1) / o_.seq_len : 0;
  }
}

DedupResult dedup_pass(const PrepareOptions& o, const std::vector<InputFile>& files, int threads,
                       const std::string& spm_text_path) {
  DedupResult r;
  DedupDecider decider(o, r, files.size());
  const DocumentSigner signer(o);
  std::ofstream spm_text;
  if (!spm_text_path.empty()) spm_text.open(spm_text_path, std::ios::binary | std::ios::trunc);
  std::vector<SpmSample> samples;
  const int64_t total = plain_text_bytes(files);
  const auto start = SteadyClock::now();
  const ReaderStats stats = pipeline_blocks(
      files, o.input, threads,
      [&](Block& b) { compute_features(o, signer, b.docs, threads, b.features); },
      [&](Block& b) {
        for (size_t i = 0; i < b.docs.size(); ++i) {
          const Document& d = b.docs[i];
          const uint8_t s = decider.decide(d.file, static_cast<int64_t>(d.text.size()), d.line,
                                           d.id, b.features[i]);
          if (s == kKept && !spm_text_path.empty() && r.spm_bytes < kSpmTrainBytes) {
            const size_t begin = r.spm_bytes;
            sample_for_spm(d.text, spm_text, r.spm_bytes);
            samples.push_back({static_cast<int64_t>(r.status.size()) - 1, begin, r.spm_bytes});
          }
        }
        report_progress(o, 1, b.bytes, static_cast<int64_t>(r.status.size()), total, 0, start);
      });
  decider.finish();
  if (!spm_text_path.empty()) {
    spm_text.close();
    drop_removed_from_sample(spm_text_path, samples, r.status, r.spm_bytes);
  }
  r.bytes_in = stats.bytes;
  r.invalid = stats.invalid;
  r.first_invalid = stats.first_invalid;
  r.invalid_records = stats.invalid_records;
  return r;
}

PackResult pack_pass(const PrepareOptions& o, const std::vector<InputFile>& files,
                     const DedupResult& dedup, const LengthFilter& length_filter,
                     const Tokenizer& tokenizer, int threads) {
  PackResult r;
  Packer packer(o, tokenizer, r);
  const auto start = SteadyClock::now();
  auto kept = [&](int64_t id) {
    return dedup.status[id] == kKept && length_filter.keep(dedup.lengths[id]);
  };
  // Only the documents packed are parsed again.
  const ParsePlan plan{&dedup.invalid_records, kept};
  pipeline_blocks(
      files, o.input, threads,
      [&](Block& b) {
        b.tokens.assign(b.docs.size(), {});
        parallel_for(b.docs.size(), threads, [&](size_t i) {
          if (kept(b.first_id + static_cast<int64_t>(i)))
            encode_document(tokenizer, b.docs[i], files, b.tokens[i]);
        });
      },
      [&](Block& b) {
        for (size_t i = 0; i < b.docs.size(); ++i) {
          const int64_t id = b.first_id + static_cast<int64_t>(i);
          if (kept(id)) packer.add(static_cast<uint64_t>(id), b.tokens[i], dedup.clusters[id]);
        }
        const int64_t done = b.first_id + static_cast<int64_t>(b.docs.size());
        report_progress(o, 2, b.bytes, done, dedup.bytes_in, r.tokens_out, start);
      },
      &plan);
  packer.finish();
  return r;
}

}  // namespace keel::data
