#include "data/prepare.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <unordered_set>

#include "common/error.h"
#include "common/log.h"
#include "data/shard_format.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"

namespace keel::data {
namespace fs = std::filesystem;

namespace {

constexpr size_t kBlockDocs = 2048;
constexpr size_t kBlockBytes = size_t{32} << 20;
constexpr size_t kSpmTrainBytes = size_t{64} << 20;  // text kept for spm-train

enum Status : uint8_t { kKept = 0, kExactDup = 1, kNearDup = 2, kRepeated = 3, kOneChar = 4 };

// Runs fn(i) for i in [0, n) on up to `threads` threads.
template <class Fn>
void parallel_for(size_t n, int threads, Fn fn) {
  int t = static_cast<int>(std::min<size_t>(n, std::max(threads, 1)));
  if (t <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int k = 0; k < t; ++k)
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& th : pool) th.join();
}

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

std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& o, const std::string& spm_text,
                                          int threads) {
  const std::string& spec = o.tokenizer;
  std::string model_out = o.output + "/tokenizer.model";
  if (spec == "byte") return make_byte_tokenizer();
  if (spec.rfind("spm:", 0) == 0) {
    auto tok = load_spm_tokenizer(spec.substr(4));
    fs::copy_file(spec.substr(4), model_out, fs::copy_options::overwrite_existing);
    return tok;
  }
  if (spec.rfind("spm-train:", 0) == 0) {
    int64_t vocab = 0;
    try {
      vocab = std::stoll(spec.substr(10));
    } catch (const std::exception&) {
    }
    if (vocab < 8)
      throw DataError("--tokenizer " + spec + ": expected spm-train:VOCAB with VOCAB >= 8");
    std::string prefix = o.output + "/tokenizer";
    train_spm(spm_text, vocab, prefix, threads, o.seed);
    fs::remove(prefix + ".vocab");
    return load_spm_tokenizer(model_out);
  }
  throw DataError("--tokenizer " + spec + ": expected byte, spm:MODEL or spm-train:VOCAB");
}

void write_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw DataError(tmp + ": write failed");
  }
  fs::rename(tmp, path);
}

std::string summary_text(const nlohmann::json& r) {
  std::string s = "keel prepare report\n";
  auto line = [&](const std::string& k, const nlohmann::json& v) {
    s += fmt::format("  {:<20} {}\n", k, v.dump());
  };
  for (const char* k : {"documents_in", "exact_duplicates", "near_duplicates", "removed_by_length",
                        "removed_by_repetition", "documents_out", "tokens_out", "bytes_in",
                        "invalid_records", "seconds", "mb_per_s", "mb_per_cpu_s"})
    if (r.contains(k)) line(k, r[k]);
  const auto& lf = r["length_filter"];
  s += fmt::format(
      "length filter: kept lengths {} bytes; removed below_min={} above_max={} "
      "low_tail={} high_tail={}\n",
      lf["kept_range"].dump(), lf["removed"]["below_min"].dump(), lf["removed"]["above_max"].dump(),
      lf["removed"]["low_tail"].dump(), lf["removed"]["high_tail"].dump());
  if (r.contains("repetition_filter")) {
    const auto& rf = r["repetition_filter"];
    s += fmt::format(
        "repetition filter: removed repeated_spans={} (over {} of the bytes) one_character={} "
        "(over {} of the characters)\n",
        rf["removed"]["repeated_spans"].dump(), rf["max_repeated_share"].dump(),
        rf["removed"]["one_character"].dump(), rf["max_top_char_share"].dump());
  }
  s += "length histogram (bytes: documents, before filtering):\n";
  int64_t most = 1;
  for (const auto& b : lf["histogram"]) most = std::max(most, b["documents"].get<int64_t>());
  for (const auto& b : lf["histogram"]) {
    int64_t n = b["documents"].get<int64_t>();
    s += fmt::format("  {:>9}-{:<9} {:>9} {}\n", b["min"].get<int64_t>(), b["max"].get<int64_t>(),
                     n, std::string(static_cast<size_t>(40 * n / most), '#'));
  }
  for (auto& [name, split] : r["splits"].items())
    s += fmt::format("split {}: {} documents, {} tokens, {} windows of seq_len {}\n", name,
                     split["documents"].dump(), split["tokens"].dump(), split["windows"].dump(),
                     r["seq_len"].dump());
  return s;
}

double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

PrepareOptions recommended_prepare_options() {
  PrepareOptions o;
  o.val_fraction = 0.02;
  o.length.drop_percentile_tails = 0.5;
  o.repetition.max_repeated_share = 0.4;
  o.repetition.max_top_char_share = 0.5;
  o.keep_whole = 0.1;
  return o;
}

nlohmann::json prepare(const PrepareOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = cpu_seconds();
  int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  if (o.output.empty()) throw DataError("--output: a directory is required");
  if (o.val_fraction < 0 || o.val_fraction >= 1)
    throw DataError("--val-fraction " + std::to_string(o.val_fraction) + ": expected [0, 1)");
  if (o.seq_len < 1) throw DataError("--seq-len must be positive");
  if (o.cluster != "hash" && o.cluster != "source")
    throw DataError("--cluster " + o.cluster + ": expected hash or source");
  if (o.near_dedup) {
    if (o.minhash.bands <= 0 || o.minhash.num_perm % o.minhash.bands != 0)
      throw DataError("--num-perm " + std::to_string(o.minhash.num_perm) +
                      " must be a positive multiple of --bands " + std::to_string(o.minhash.bands));
    if (o.minhash.threshold <= 0 || o.minhash.threshold > 1)
      throw DataError("--dedup-threshold must be in (0, 1]");
  }
  std::vector<std::string> skipped;
  auto files = expand_inputs(o.inputs, o.input, &skipped);

  // The output directory: remove what a previous prepare left (meta.json first, so an interrupted
  // run never leaves a directory that looks complete).
  fs::create_directories(o.output);
  fs::remove(o.output + "/meta.json");
  for (const auto& e : fs::directory_iterator(o.output)) {
    auto name = e.path().filename().string();
    auto ext = e.path().extension().string();
    if (ext == ".bin" || ext == ".idx" || name == "tokenizer.model") fs::remove(e.path());
  }

  // ---- Pass 1: dedup decisions and lengths. ----
  std::vector<uint8_t> status;   // per input document
  std::vector<int64_t> lengths;  // per input document (bytes)
  std::vector<int64_t> file_first(files.size(), -1), file_docs(files.size(), 0);
  std::unordered_set<uint64_t> exact_seen;
  MinHashConfig mh = o.minhash;
  mh.seed = o.seed;
  MinHasher hasher(mh);
  std::unique_ptr<NearDuplicateIndex> near;
  if (o.near_dedup) near = std::make_unique<NearDuplicateIndex>(mh);
  int64_t exact_dups = 0, near_dups = 0, repeated = 0, one_char = 0, bytes_in = 0, invalid = 0;
  int64_t tokens_out = 0;  // written in pass 2
  std::string first_invalid;
  const bool train_spm = o.tokenizer.rfind("spm-train:", 0) == 0;
  std::string spm_text_path = o.output + "/.spm_train.txt";
  std::ofstream spm_text;
  size_t spm_bytes = 0;
  if (train_spm) spm_text.open(spm_text_path, std::ios::binary | std::ios::trunc);
  // Plain-text inputs are read byte for byte, so their sizes are pass 1's total; a compressed
  // input's text size is only known once read.
  int64_t pass1_total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f.path, ec);
    const auto ext = fs::path(f.path).extension().string();
    if (ec || ext == ".gz" || ext == ".zst") {
      pass1_total = 0;
      break;
    }
    pass1_total += static_cast<int64_t>(size);
  }
  auto report_progress = [&](int pass, const DocumentReader& reader, int64_t documents,
                             int64_t total, std::chrono::steady_clock::time_point start) {
    if (!o.on_progress) return;
    PrepareProgress p;
    p.pass = pass;
    p.documents = documents;
    p.bytes_read = reader.bytes_read();
    p.bytes_total = total;
    p.tokens_out = tokens_out;
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    o.on_progress(p);
  };
  {
    const auto pass_start = std::chrono::steady_clock::now();
    DocumentReader reader(files, o.input);
    std::vector<Document> block;
    std::vector<uint64_t> hashes;
    std::vector<std::vector<uint32_t>> sigs;
    std::vector<uint8_t> verdicts;
    while (read_block(reader, block)) {
      hashes.assign(block.size(), 0);
      sigs.assign(block.size(), {});
      verdicts.assign(block.size(), kKept);
      parallel_for(block.size(), threads, [&](size_t i) {
        const auto why = repetition_verdict(o.repetition, block[i].text);
        if (!why.empty()) {
          verdicts[i] = why == "one_character" ? kOneChar : kRepeated;
          return;
        }
        hashes[i] = normalized_hash(block[i].text);
        if (near) {
          auto shingles = shingle_set(block[i].text, mh.char_shingles, mh.shingle_size);
          if (!shingles.empty()) sigs[i] = hasher.signature(shingles);
        }
      });
      for (size_t i = 0; i < block.size(); ++i) {
        int64_t id = static_cast<int64_t>(status.size());
        auto f = block[i].file;
        if (file_first[f] < 0) file_first[f] = id;
        ++file_docs[f];
        lengths.push_back(static_cast<int64_t>(block[i].text.size()));
        uint8_t s = verdicts[i];
        if (s != kKept) {
          ++(s == kOneChar ? one_char : repeated);
        } else if (o.exact_dedup && !exact_seen.insert(hashes[i]).second) {
          s = kExactDup;
          ++exact_dups;
        } else if (near && !sigs[i].empty()) {
          if (near->find(sigs[i]) >= 0) {
            s = kNearDup;
            ++near_dups;
          } else {
            near->insert(id, std::move(sigs[i]));
          }
        }
        status.push_back(s);
        if (s == kKept && train_spm && spm_bytes < kSpmTrainBytes) {
          std::string_view text = block[i].text;
          size_t start = 0;
          while (start < text.size()) {
            size_t end = text.find('\n', start);
            if (end == std::string_view::npos) end = text.size();
            auto line = text.substr(start, end - start);
            if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
              spm_text << line << '\n';
              spm_bytes += line.size() + 1;
            }
            start = end + 1;
          }
        }
      }
      report_progress(1, reader, static_cast<int64_t>(status.size()), pass1_total, pass_start);
    }
    bytes_in = reader.bytes_read();
    invalid = reader.invalid_records();
    first_invalid = reader.first_invalid();
  }
  if (invalid > 0)
    log::warn("data", "{} invalid JSONL record(s) skipped; first: {}", invalid, first_invalid);
  if (train_spm) spm_text.close();
  std::vector<int64_t> dedup_lengths;
  for (size_t i = 0; i < status.size(); ++i)
    if (status[i] == kKept) dedup_lengths.push_back(lengths[i]);
  LengthFilter length_filter(o.length, dedup_lengths);
  dedup_lengths.clear();
  dedup_lengths.shrink_to_fit();

  std::unique_ptr<Tokenizer> tokenizer;
  if (train_spm) {
    if (spm_bytes == 0) throw DataError("spm-train: no text left to train on after dedup");
    tokenizer = make_tokenizer(o, spm_text_path, threads);
    fs::remove(spm_text_path);
  } else {
    tokenizer = make_tokenizer(o, "", threads);
  }
  const uint32_t token_bytes = tokenizer->vocab_size() <= 65536 ? 2 : 4;
  const uint32_t boundary = tokenizer->boundary_id();

  // ---- Pass 2: tokenize and write. ----
  std::map<std::string, std::unique_ptr<SplitWriter>> writers;
  writers["train"] = std::make_unique<SplitWriter>(
      o.output, "train", token_bytes, tokenizer->vocab_size(), boundary, o.shard_tokens);
  if (o.val_fraction > 0)
    writers["val"] = std::make_unique<SplitWriter>(
        o.output, "val", token_bytes, tokenizer->vocab_size(), boundary, o.shard_tokens);
  int64_t fill_tokens = 0, whole_docs = 0, long_docs = 0, docs_out = 0;
  {
    const auto pass_start = std::chrono::steady_clock::now();
    DocumentReader reader(files, o.input);
    std::vector<Document> block;
    std::vector<std::vector<uint32_t>> tokens;
    std::vector<uint64_t> hashes;
    int64_t id0 = 0;
    while (read_block(reader, block)) {
      tokens.assign(block.size(), {});
      hashes.assign(block.size(), 0);
      auto kept = [&](size_t i) {
        int64_t id = id0 + static_cast<int64_t>(i);
        return status[id] == kKept && length_filter.keep(lengths[id]);
      };
      parallel_for(block.size(), threads, [&](size_t i) {
        if (!kept(i)) return;
        tokenizer->encode(block[i].text, tokens[i]);
        hashes[i] = normalized_hash(block[i].text);
      });
      for (size_t i = 0; i < block.size(); ++i) {
        if (!kept(i)) continue;
        uint64_t id = static_cast<uint64_t>(id0 + static_cast<int64_t>(i));
        bool val = o.val_fraction > 0 && unit(mix(o.seed, id)) < o.val_fraction;
        SplitWriter& w = *writers[val ? "val" : "train"];
        int64_t len = static_cast<int64_t>(tokens[i].size());
        if (len + 1 > o.seq_len + 1) ++long_docs;  // spans windows, with boundary tokens around it
        if (o.keep_whole > 0 && len <= o.seq_len && unit(mix(o.seed ^ 0x5eed, id)) < o.keep_whole) {
          int64_t r = w.tokens() % o.seq_len;
          if (r != 0 && r + len > o.seq_len) {
            w.add_fill(o.seq_len - r);
            fill_tokens += o.seq_len - r;
          }
          ++whole_docs;
        }
        uint32_t cluster = o.cluster == "source" ? static_cast<uint32_t>(block[i].file)
                                                 : static_cast<uint32_t>(hashes[i] >> 32);
        w.add_document(tokens[i], id, cluster);
        tokens_out += len;
        ++docs_out;
      }
      id0 += static_cast<int64_t>(block.size());
      report_progress(2, reader, id0, bytes_in, pass_start);
    }
  }

  nlohmann::json splits;
  for (auto& [name, w] : writers) {
    splits[name] = w->finish();
    int64_t n = splits[name]["tokens"].get<int64_t>();
    splits[name]["windows"] = n > 1 ? (n - 1) / o.seq_len : 0;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = cpu_seconds() - cpu0;  // of the whole process: prepare is all it does

  nlohmann::json inputs = nlohmann::json::array();
  for (size_t f = 0; f < files.size(); ++f)
    inputs.push_back({{"path", files[f].path},
                      {"format", files[f].jsonl ? "jsonl" : "text"},
                      {"first_doc", std::max<int64_t>(file_first[f], 0)},
                      {"documents", file_docs[f]}});

  nlohmann::json report = {
      {"documents_in", static_cast<int64_t>(status.size())},
      {"exact_duplicates", exact_dups},
      {"near_duplicates", near_dups},
      {"removed_by_length", length_filter.removed()},
      {"removed_by_repetition", repeated + one_char},
      {"documents_out", docs_out},
      {"tokens_out", tokens_out},
      {"bytes_in", bytes_in},
      {"input_files", static_cast<int64_t>(files.size())},
      {"skipped_files", skipped},
      {"invalid_records", invalid},
      {"first_invalid_record", first_invalid},
      {"dedup",
       {{"exact", o.exact_dedup},
        {"near", o.near_dedup},
        {"threshold", mh.threshold},
        {"num_perm", mh.num_perm},
        {"bands", mh.bands},
        {"rows", mh.bands > 0 ? mh.num_perm / mh.bands : 0},
        {"shingle", mh.char_shingles ? "char" : "word"},
        {"shingle_size", mh.shingle_size},
        {"candidates_checked", near ? near->candidates_checked() : 0}}},
      {"length_filter", length_filter.report()},
      {"repetition_filter",
       {{"max_repeated_share", o.repetition.max_repeated_share},
        {"repeat_span_bytes", kRepeatSpan},
        {"max_top_char_share", o.repetition.max_top_char_share},
        {"removed", {{"repeated_spans", repeated}, {"one_character", one_char}}}}},
      {"packing",
       {{"seq_len", o.seq_len},
        {"boundary_id", boundary},
        {"documents_longer_than_window", long_docs},
        {"keep_whole", o.keep_whole},
        {"documents_kept_whole", whole_docs},
        {"fill_tokens", fill_tokens}}},
      {"seq_len", o.seq_len},
      {"splits", splits},
      {"threads", threads},
      {"seconds", seconds},
      {"mb_per_s", seconds > 0 ? bytes_in / 1e6 / seconds : 0.0},
      {"mb_per_s_per_thread", seconds > 0 ? bytes_in / 1e6 / seconds / threads : 0.0},
      {"cpu_seconds", cpu},
      {"mb_per_cpu_s", cpu > 0 ? bytes_in / 1e6 / cpu : 0.0}};
  for (auto& [name, s] : report["splits"].items()) s.erase("shards"), s.erase("index");

  nlohmann::json meta = {{"format", kMetaFormatName},
                         {"version", kShardFormatVersion},
                         {"created_by", std::string("keel ") + KEEL_VERSION},
                         {"prepare_command", o.command},
                         {"tokenizer", tokenizer->describe()},
                         {"vocab_size", tokenizer->vocab_size()},
                         {"token_dtype", token_bytes == 2 ? "uint16" : "uint32"},
                         {"boundary_id", boundary},
                         {"seq_len", o.seq_len},
                         {"counts",
                          {{"documents_in", report["documents_in"]},
                           {"exact_duplicates", exact_dups},
                           {"near_duplicates", near_dups},
                           {"removed_by_length", length_filter.removed()},
                           {"removed_by_repetition", repeated + one_char},
                           {"documents_out", docs_out},
                           {"tokens_out", tokens_out}}},
                         {"inputs", inputs},
                         {"splits", splits}};
  write_atomic(o.output + "/report.json", report.dump(2) + "\n");
  write_atomic(o.output + "/report.txt", summary_text(report));
  write_atomic(o.output + "/meta.json", meta.dump(2) + "\n");
  return report;
}

}  // namespace keel::data
