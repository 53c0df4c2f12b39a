#include "data/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <unordered_set>

#include "common/error.h"
#include "common/log.h"
#include "common/paths.h"
#include "data/hf_bpe.h"
#include "data/prepare_passes.h"
#include "data/shard_format.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"

namespace keel::data {
namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& o, const std::string& spm_text,
                                          int threads) {
  const TokenizerSpec& spec = o.tokenizer;
  const std::string model_out = o.output + "/tokenizer.model";
  switch (spec.kind) {
    case TokenizerSpec::Kind::kByte:
      return make_byte_tokenizer();
    case TokenizerSpec::Kind::kSpm: {
      auto tok = load_spm_tokenizer(spec.model);
      fs::copy_file(spec.model, model_out, fs::copy_options::overwrite_existing);
      return tok;
    }
    case TokenizerSpec::Kind::kSpmTrain: {
      const std::string prefix = o.output + "/tokenizer";
      train_spm(spm_text, spec.vocab, prefix, threads, o.seed);
      fs::remove(prefix + ".vocab");
      return load_spm_tokenizer(model_out);
    }
    case TokenizerSpec::Kind::kHf: {
      auto tok = load_hf_tokenizer(spec.model);
      fs::copy_file(spec.model, o.output + "/tokenizer.json", fs::copy_options::overwrite_existing);
      return tok;
    }
  }
  throw std::logic_error("make_tokenizer: unknown kind");
}

namespace {

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
  if (r.value("removed_too_long", int64_t{0}) > 0)
    s += fmt::format("too long: removed {} document(s) over {} bytes, unread past that\n",
                     r["removed_too_long"].dump(), r["max_document_bytes"].dump());
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
  if (r.contains("clusters")) {
    const auto& c = r["clusters"];
    const auto shares = c["bucket_shares_16"].get<std::vector<double>>();
    s += fmt::format(
        "clusters ({}): {} distinct, the largest holds {:.1f} % of the documents; the 16 "
        "buckets hold {:.1f} % to {:.1f} % each\n",
        c["by"].get<std::string>(), c["distinct"].get<int64_t>(),
        100 * c["largest_share"].get<double>(),
        100 * *std::min_element(shares.begin(), shares.end()),
        100 * *std::max_element(shares.begin(), shares.end()));
  }
  return s;
}

}  // namespace

std::string TokenizerSpec::text() const {
  switch (kind) {
    case Kind::kByte:
      return "byte";
    case Kind::kSpm:
      return "spm:" + model;
    case Kind::kSpmTrain:
      return "spm-train:" + std::to_string(vocab);
    case Kind::kHf:
      return "hf:" + model;
  }
  return "?";
}

TokenizerSpec TokenizerSpec::parse(const std::string& spec) {
  TokenizerSpec t;
  if (spec == "byte") return t;
  if (spec.rfind("spm:", 0) == 0 && spec.size() > 4) {
    t.kind = Kind::kSpm;
    t.model = spec.substr(4);
    return t;
  }
  if (spec.rfind("hf:", 0) == 0 && spec.size() > 3) {
    t.kind = Kind::kHf;
    t.model = spec.substr(3);
    return t;
  }
  if (spec.rfind("spm-train:", 0) == 0) {
    t.kind = Kind::kSpmTrain;
    const std::string digits = spec.substr(10);
    if (!digits.empty() && digits.size() < 10 &&
        digits.find_first_not_of("0123456789") == std::string::npos)
      t.vocab = std::stoll(digits);
    if (t.vocab >= 8) return t;
    throw DataError("--tokenizer " + spec + ": expected spm-train:VOCAB with VOCAB >= 8");
  }
  throw DataError("--tokenizer " + spec +
                  ": expected byte, spm:MODEL, spm-train:VOCAB or hf:PATH/tokenizer.json");
}

PrepareOptions recommended_prepare_options() {
  PrepareOptions o;
  o.val_fraction = 0.02;
  o.length.drop_percentile_tails = 0.5;
  o.repetition.max_repeated_share = 0.4;
  o.repetition.max_top_char_share = 0.5;
  o.keep_whole = 0.1;
  return o;
}

namespace {

// The dataset written into `o.output` (an empty staging directory) from `files`.
// A prepare that keeps no document writes nothing (write_staged removes the staging directory):
// a dataset of zero documents would pass until `keel train` refused it.
[[noreturn]] void refuse_empty_dataset(const DedupResult& d) {
  std::string why = fmt::format("{} document(s) read", d.status.size());
  if (d.invalid > 0)
    why +=
        fmt::format(", {} invalid record(s) skipped (the first: {})", d.invalid, d.first_invalid);
  if (d.exact_dups + d.near_dups > 0)
    why += fmt::format(", {} exact and {} near duplicate(s) removed", d.exact_dups, d.near_dups);
  if (d.too_long > 0)
    why += fmt::format(", {} longer than {} MiB removed", d.too_long, kMaxDocumentBytes >> 20);
  throw DataError(
      "prepare: no document is left to write (" + why + "), so no dataset was written\nHINT: " +
      (d.invalid > 0 ? "--text-field names the key (JSONL) or column (parquet) that holds the "
                       "text; check it against the first invalid record"
                     : "check --min-length/--max-length and the inputs' contents"));
}

nlohmann::json write_dataset(const PrepareOptions& o, const std::vector<InputFile>& files,
                             const std::vector<std::string>& skipped);

// Staging directories of prepares into `output` whose process is gone (killed midway).
void remove_stale_staging(const fs::path& output) {
  std::error_code ec;
  const fs::path parent = output.parent_path().empty() ? fs::path(".") : output.parent_path();
  const std::string prefix = output.filename().string() + ".tmp-";
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && is_stale_tmp(name)) remove_tree(e.path(), ec);
  }
}

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Makes the staged dataset the output, atomically: a reader (or a kill -9 at any moment) sees the
// old dataset or the new one, never a mix. The replaced dataset is removed after the exchange.
void commit_dataset(const fs::path& staging, const fs::path& output) {
  for (const auto& e : fs::directory_iterator(staging)) fsync_path(e.path());
  fsync_path(staging);
  bool exchanged = false;
  if (const int err = rename_or_exchange(staging, output, &exchanged); err != 0)
    throw DataError(output.string() +
                    ": cannot move the new dataset into place: " + std::strerror(err));
  if (exchanged) {
    std::error_code ec;
    remove_tree(staging, ec);  // the old dataset, swapped out
  }
  fsync_path(output.parent_path().empty() ? fs::path(".") : output.parent_path());
}

// --output as the directory the dataset is renamed onto: absolute, symlinks resolved. The working
// directory itself or one of its parents cannot be renamed onto: DataError naming the flag.
fs::path resolved_output(const std::string& output) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(output), ec);
  if (ec) p = fs::absolute(output).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const fs::path cwd = fs::current_path(ec);
  const auto rel = cwd.lexically_relative(p);
  if (!ec && !rel.empty() && (rel == "." || *rel.begin() != ".."))
    throw DataError("--output " + output + ": the working directory or a parent of it; name a " +
                    "directory for the dataset (it is written beside that name and renamed onto " +
                    "it), e.g. --output data/corpus");
  return p;
}

// An input inside the output would be deleted with the dataset it replaces (--overwrite).
void refuse_inputs_inside(const std::vector<InputFile>& files, const fs::path& output,
                          const std::string& flag) {
  for (const auto& f : files) {
    if (lies_inside(f.path, output))
      throw DataError("--input " + f.path + " lies inside --output " + flag +
                      ", which the new dataset replaces whole; HINT: keep the raw text outside " +
                      "the dataset directory, or prepare into another --output");
  }
}

}  // namespace

bool lies_inside(const fs::path& path, const fs::path& dir) {
  std::error_code ec, dir_ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  const fs::path d = fs::weakly_canonical(fs::absolute(dir), dir_ec);
  const auto rel = p.lexically_relative(d);
  return !ec && !dir_ec && !rel.empty() && *rel.begin() != "..";
}

void check_prepare_output(const std::string& output, bool overwrite) {
  if (output.empty()) throw DataError("--output: a directory is required");
  std::error_code ec;
  if (!fs::exists(output, ec)) return;
  if (!fs::is_directory(output, ec))
    throw DataError("--output " + output + ": exists and is not a directory");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(output, ec)) {
    names.push_back(e.path().filename().string());
    if (names.size() >= 100000) break;
  }
  if (names.empty() || overwrite) return;
  std::sort(names.begin(), names.end());
  const bool dataset = fs::exists(fs::path(output) / "meta.json", ec);
  // What is there, the dataset's own file first when it is one.
  std::string listed = dataset ? "meta.json" : "";
  size_t shown = dataset ? 1 : 0;
  for (const auto& n : names) {
    if (shown == 5) break;
    if (dataset && n == "meta.json") continue;
    listed += (listed.empty() ? "" : ", ") + n;
    ++shown;
  }
  if (names.size() > shown) listed += ", ... (" + std::to_string(names.size()) + " entries)";
  throw DataError("--output " + output + ": not empty (" + listed + ")" +
                  (dataset ? "; it holds a prepared dataset" : "") +
                  "\nHINT: choose a new --output directory, or pass --overwrite to replace " +
                  (dataset ? "that dataset" : "its contents") +
                  " (the new dataset is written beside it and swapped in whole)");
}

void check_prepare_options(const PrepareOptions& o) {
  if (o.output.empty()) throw DataError("--output: a directory is required");
  if (o.val_fraction < 0 || o.val_fraction >= 1)
    throw DataError("--val-fraction " + std::to_string(o.val_fraction) + ": expected [0, 1)");
  if (o.seq_len < 1) throw DataError("--seq-len must be positive");
  std::error_code ec;
  if (o.tokenizer.kind == TokenizerSpec::Kind::kSpm && !fs::is_regular_file(o.tokenizer.model, ec))
    throw DataError("--tokenizer " + o.tokenizer.text() + ": no such SentencePiece model" +
                    relative_note(o.tokenizer.model));
  if (o.tokenizer.kind == TokenizerSpec::Kind::kHf) {
    if (!fs::is_regular_file(o.tokenizer.model, ec))
      throw DataError("--tokenizer " + o.tokenizer.text() + ": no such tokenizer.json" +
                      relative_note(o.tokenizer.model));
    load_hf_tokenizer(o.tokenizer.model);  // refused before anything is written
  }
  if (o.near_dedup) {
    if (o.minhash.bands <= 0 || o.minhash.num_perm % o.minhash.bands != 0)
      throw DataError("--num-perm " + std::to_string(o.minhash.num_perm) +
                      " must be a positive multiple of --bands " + std::to_string(o.minhash.bands) +
                      (o.minhash.scheme == MinHashScheme::kDatatrove
                           ? " (--minhash-scheme datatrove's default, unless --bands is given)"
                           : ""));
    if (o.minhash.threshold <= 0 || o.minhash.threshold > 1)
      throw DataError("--dedup-threshold must be in (0, 1]");
  }
  if (o.minhash.scheme == MinHashScheme::kDatatrove && o.minhash.char_shingles)
    throw DataError(
        "--shingle char: --minhash-scheme datatrove shingles words; use --shingle word "
        "or --minhash-scheme keel");
}

nlohmann::json write_staged(const PrepareOptions& o, const std::vector<InputFile>& files,
                            const std::function<nlohmann::json(const PrepareOptions&)>& write) {
  check_prepare_output(o.output, o.overwrite);
  // Everything is written into a staging directory beside the output (beside what a symlink names)
  // and swapped in whole at the end, so an existing dataset (--overwrite) is never half replaced.
  const fs::path output = resolved_output(o.output);
  refuse_inputs_inside(files, output, o.output);
  fs::create_directories(output.parent_path());
  remove_stale_staging(output);
  const fs::path staging = output.string() + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(staging);
  PrepareOptions staged = o;
  staged.output = staging.string();
  nlohmann::json report;
  try {
    report = write(staged);
    commit_dataset(staging, output);
  } catch (...) {
    std::error_code ec;
    remove_tree(staging, ec);
    throw;
  }
  return report;
}

nlohmann::json prepare(const PrepareOptions& o) {
  check_prepare_options(o);
  check_prepare_output(o.output, o.overwrite);
  std::vector<std::string> skipped;
  const auto files = expand_inputs(o.inputs, o.input, &skipped);
  return write_staged(o, files, [&](const PrepareOptions& staged) {
    return write_dataset(staged, files, skipped);
  });
}

namespace {

// The cluster mix the stratified sampler will see: how many clusters, how much the largest holds,
// and the documents' shares of the 16 buckets of data.buckets' default (cluster id mod 16).
nlohmann::json cluster_mix(const PrepareOptions& o, const PackResult& p) {
  constexpr size_t kBuckets = 16;
  int64_t total = 0, largest = 0;
  std::vector<int64_t> buckets(kBuckets, 0);
  for (const auto& [cluster, docs] : p.cluster_docs) {
    total += docs;
    largest = std::max(largest, docs);
    buckets[cluster % kBuckets] += docs;
  }
  auto share = [total](int64_t n) {
    return total > 0 ? std::round(1e4 * static_cast<double>(n) / static_cast<double>(total)) / 1e4
                     : 0.0;
  };
  nlohmann::json shares = nlohmann::json::array();
  for (int64_t n : buckets) shares.push_back(share(n));
  const char* by = o.cluster == ClusterBy::kMinHash ? "minhash"
                   : o.cluster == ClusterBy::kHash  ? "hash"
                                                    : "source";
  return {{"by", by},
          {"distinct", static_cast<int64_t>(p.cluster_docs.size())},
          {"largest_documents", largest},
          {"largest_share", share(largest)},
          {"bucket_shares_16", shares}};
}

// The report.json of a prepare: every figure of both passes, machine-readable.
nlohmann::json make_report(const PrepareOptions& o, const std::vector<InputFile>& files,
                           const std::vector<std::string>& skipped, const DedupResult& d,
                           const LengthFilter& length_filter, const PackResult& p,
                           uint32_t boundary, int threads, double seconds, double cpu) {
  const MinHashConfig& mh = o.minhash;
  nlohmann::json report = {
      {"documents_in", static_cast<int64_t>(d.status.size())},
      {"exact_duplicates", d.exact_dups},
      {"near_duplicates", d.near_dups},
      {"removed_by_length", length_filter.removed()},
      {"removed_by_repetition", d.repeated + d.one_char},
      {"removed_too_long", d.too_long},
      {"max_document_bytes", kMaxDocumentBytes},
      {"documents_out", p.docs_out},
      {"tokens_out", p.tokens_out},
      {"bytes_in", d.bytes_in},
      {"input_files", static_cast<int64_t>(files.size())},
      {"skipped_files", skipped},
      {"invalid_records", d.invalid},
      {"first_invalid_record", d.first_invalid},
      {"dedup",
       {{"exact", o.exact_dedup},
        {"near", o.near_dedup},
        {"scheme", minhash_scheme_name(mh.scheme)},
        // datatrove's scheme has no similarity check: every LSH candidate is a duplicate.
        {"threshold", mh.scheme == MinHashScheme::kKeel ? nlohmann::json(mh.threshold) : nullptr},
        {"num_perm", mh.num_perm},
        {"bands", mh.bands},
        {"rows", mh.bands > 0 ? mh.num_perm / mh.bands : 0},
        {"shingle", mh.char_shingles ? "char" : "word"},
        {"shingle_size", mh.shingle_size},
        {"candidates_checked", d.candidates_checked}}},
      {"length_filter", length_filter.report()},
      {"repetition_filter",
       {{"max_repeated_share", o.repetition.max_repeated_share},
        {"repeat_span_bytes", kRepeatSpan},
        {"max_top_char_share", o.repetition.max_top_char_share},
        {"removed", {{"repeated_spans", d.repeated}, {"one_character", d.one_char}}}}},
      {"packing",
       {{"seq_len", o.seq_len},
        {"boundary_id", boundary},
        {"documents_longer_than_window", p.long_docs},
        {"keep_whole", o.keep_whole},
        {"documents_kept_whole", p.whole_docs},
        {"fill_tokens", p.fill_tokens}}},
      {"seq_len", o.seq_len},
      {"splits", p.splits},
      {"clusters", cluster_mix(o, p)},
      {"threads", threads},
      {"seconds", seconds},
      {"mb_per_s", seconds > 0 ? d.bytes_in / 1e6 / seconds : 0.0},
      {"mb_per_s_per_thread", seconds > 0 ? d.bytes_in / 1e6 / seconds / threads : 0.0},
      {"cpu_seconds", cpu},
      {"mb_per_cpu_s", cpu > 0 ? d.bytes_in / 1e6 / cpu : 0.0}};
  for (auto& [name, s] : report["splits"].items()) s.erase("shards"), s.erase("index");
  return report;
}

// meta.json: what the loader needs (format, vocabulary, boundary, splits and their shards) and
// where every document came from.
nlohmann::json make_meta(const PrepareOptions& o, const std::vector<InputFile>& files,
                         const DedupResult& d, const nlohmann::json& report, const PackResult& p,
                         const Tokenizer& tokenizer) {
  nlohmann::json inputs = nlohmann::json::array();
  for (size_t f = 0; f < files.size(); ++f)
    inputs.push_back({{"path", files[f].path},
                      {"format", files[f].format()},
                      {"first_doc", std::max<int64_t>(d.file_first[f], 0)},
                      {"documents", d.file_docs[f]}});
  nlohmann::json counts = nlohmann::json::object();
  for (const char* k : {"documents_in", "exact_duplicates", "near_duplicates", "removed_by_length",
                        "removed_by_repetition", "documents_out", "tokens_out"})
    counts[k] = report[k];
  return {{"format", kMetaFormatName},
          {"version", kShardFormatVersion},
          {"created_by", std::string("keel ") + KEEL_VERSION},
          {"prepare_command", o.command},
          {"tokenizer", tokenizer.describe()},
          {"vocab_size", tokenizer.vocab_size()},
          {"token_dtype", token_bytes_for(tokenizer.vocab_size()) == 2 ? "uint16" : "uint32"},
          {"boundary_id", tokenizer.boundary_id()},
          {"seq_len", o.seq_len},
          {"counts", counts},
          {"inputs", inputs},
          {"sources", d.sources},
          {"splits", p.splits}};
}

nlohmann::json write_dataset(const PrepareOptions& o, const std::vector<InputFile>& files,
                             const std::vector<std::string>& skipped) {
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = cpu_seconds();
  const int threads = worker_threads(o);
  const bool train_spm = o.tokenizer.kind == TokenizerSpec::Kind::kSpmTrain;
  const std::string spm_text_path = train_spm ? o.output + "/.spm_train.txt" : "";

  const DedupResult dedup = dedup_pass(o, files, threads, spm_text_path);
  if (dedup.invalid > 0)
    log::warn("data", "{} invalid JSONL record(s) skipped; first: {}", dedup.invalid,
              dedup.first_invalid);
  const LengthFilter length_filter(o.length, dedup.kept_lengths());
  if (train_spm && dedup.spm_bytes == 0)
    throw DataError("spm-train: no text left to train on after dedup");
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(o, spm_text_path, threads);
  if (train_spm) fs::remove(spm_text_path);

  const PackResult packed = pack_pass(o, files, dedup, length_filter, *tokenizer, threads);
  if (packed.docs_out == 0) refuse_empty_dataset(dedup);
  PrepareTiming timing;
  timing.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  timing.cpu_seconds = cpu_seconds() - cpu0;  // of the whole process: prepare is all it does
  timing.threads = threads;
  return write_reports_and_meta(o, files, skipped, dedup, length_filter, packed, *tokenizer,
                                timing);
}

}  // namespace

nlohmann::json write_reports_and_meta(const PrepareOptions& o, const std::vector<InputFile>& files,
                                      const std::vector<std::string>& skipped,
                                      const DedupResult& dedup, const LengthFilter& length_filter,
                                      const PackResult& packed, const Tokenizer& tokenizer,
                                      const PrepareTiming& timing,
                                      const nlohmann::json& extra_meta) {
  const nlohmann::json report =
      make_report(o, files, skipped, dedup, length_filter, packed, tokenizer.boundary_id(),
                  timing.threads, timing.seconds, timing.cpu_seconds);
  nlohmann::json meta = make_meta(o, files, dedup, report, packed, tokenizer);
  if (extra_meta.is_object()) meta.update(extra_meta);
  write_atomic(o.output + "/report.json", report.dump(2) + "\n");
  write_atomic(o.output + "/report.txt", summary_text(report));
  write_atomic(o.output + "/meta.json", meta.dump(2) + "\n");
  return report;
}

}  // namespace keel::data
