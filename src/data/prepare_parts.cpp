#include "data/prepare_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unordered_set>

#include "common/error.h"
#include "common/log.h"
#include "common/paths.h"
#include "data/file_header_check.h"
#include "data/headered_file.h"
#include "data/mapped_file.h"
#include "data/part_format.h"
#include "data/prepare_passes.h"
#include "data/shard_format.h"
#include "data/tokenizer.h"

namespace keel::data {
namespace fs = std::filesystem;
namespace {

uint64_t file_xxh3(const std::string& path) {
  const MappedFile f(path, "was it removed while the prepare ran?");
  return xxh3(f.data(), f.size());
}

// The whole input list with sizes: every task must see the same one.
nlohmann::json inputs_json(const std::vector<InputFile>& files) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f.path, ec);
    out.push_back({{"path", f.path}, {"format", f.format()}, {"bytes", ec ? 0 : size}});
  }
  return out;
}

// [first, end) of the input files task `task` of `tasks` reads: a file goes to the task whose
// share of the total bytes holds its middle byte, so the tasks' shares are contiguous, in corpus
// order, and as even as whole files allow (N files of about one size make one file per task).
std::pair<size_t, size_t> task_files(const nlohmann::json& inputs, int task, int tasks) {
  std::vector<unsigned __int128> middle2;  // twice the offset of each file's middle
  unsigned __int128 total = 0;
  for (const auto& in : inputs) {
    const uint64_t size = std::max<uint64_t>(in.at("bytes").get<uint64_t>(), 1);
    middle2.push_back(2 * total + size);
    total += size;
  }
  auto owner = [&](size_t f) {
    return static_cast<int>(
        std::min<unsigned __int128>(middle2[f] * tasks / (2 * total), tasks - 1));
  };
  size_t first = 0;
  while (first < middle2.size() && owner(first) < task) ++first;
  size_t end = first;
  while (end < middle2.size() && owner(end) == task) ++end;
  return {first, end};
}

// Streams a part's documents into its payload files.
class PartWriter {
 public:
  PartWriter(const std::string& dir, uint32_t token_bytes) : token_bytes_(token_bytes) {
    for (const auto& p : kPayload)
      files_.push_back(std::make_unique<HeaderedFileWriter>(dir + "/" + p.name));
  }

  void add(uint32_t file, const Document& doc, const DocumentFeatures& f, bool tokenized,
           const std::vector<uint32_t>& tokens) {
    if (!f.signature.empty()) {
      files_[1]->put(f.signature.data(), f.signature.size() * 4);
      ++signatures_;
    }
    if (tokenized) {
      if (token_bytes_ == 2) {
        narrow_.assign(tokens.begin(), tokens.end());
        files_[2]->put(narrow_.data(), narrow_.size() * 2);
      } else {
        files_[2]->put(tokens.data(), tokens.size() * 4);
      }
      tokens_ += tokens.size();
    }
    files_[3]->put(doc.id.data(), doc.id.size());
    id_bytes_ += doc.id.size();
    const PartRecord r{file,
                       f.verdict,
                       static_cast<uint8_t>(!f.signature.empty()),
                       static_cast<uint8_t>(tokenized),
                       0,
                       static_cast<int64_t>(doc.text.size()),
                       doc.line,
                       f.hash,
                       id_bytes_,
                       tokens_};
    files_[0]->put(&r, sizeof r);
    ++documents_;
  }

  // part.json's "payload": each file's name, entries and xxh3.
  nlohmann::json finish(int words_per_signature) {
    const uint64_t counts[] = {documents_, signatures_ * static_cast<uint64_t>(words_per_signature),
                               tokens_, id_bytes_};
    nlohmann::json out = nlohmann::json::object();
    for (size_t k = 0; k < files_.size(); ++k) {
      const uint32_t elem = k == 2 ? token_bytes_ : kPayload[k].elem_bytes;
      const uint64_t sum = files_[k]->close(kPayload[k].magic, elem, counts[k]);
      out[kPayload[k].name] = {{"entries", counts[k]}, {"xxh3", hex64(sum)}};
    }
    return out;
  }

  uint64_t documents() const { return documents_; }

 private:
  std::vector<std::unique_ptr<HeaderedFileWriter>> files_;
  uint32_t token_bytes_;
  std::vector<uint16_t> narrow_;
  uint64_t documents_ = 0, signatures_ = 0, tokens_ = 0, id_bytes_ = 0;
};

nlohmann::json write_part(const PrepareOptions& o, const std::vector<InputFile>& files,
                          const std::vector<std::string>& skipped, int task, int tasks) {
  const auto t0 = std::chrono::steady_clock::now();
  const int threads = worker_threads(o);
  const nlohmann::json inputs = inputs_json(files);
  const auto [first, end] = task_files(inputs, task, tasks);
  if (first == end)
    log::warn("data",
              "task {} of {} has no input file ({} files in all); its part is empty. "
              "HINT: split the input into more files than tasks",
              task, tasks, files.size());
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(o, "", threads);
  const DocumentSigner signer(o);
  PartWriter writer(o.output, token_bytes_for(tokenizer->vocab_size()));
  std::unordered_set<uint64_t> seen;  // exact duplicates within the part are out whatever else
  std::vector<uint8_t> tokenize;
  const int64_t hard_max =
      o.length.max_length > 0 ? o.length.max_length : std::numeric_limits<int64_t>::max();
  const std::vector<InputFile> mine(files.begin() + first, files.begin() + end);
  int64_t documents = 0;
  const ReaderStats stats = pipeline_blocks(
      mine, o.input, threads,
      [&](Block& b) { compute_features(o, signer, b.docs, threads, b.features); },
      [&](Block& b) {
        const std::vector<Document>& block = b.docs;
        tokenize.assign(block.size(), 0);
        b.tokens.assign(block.size(), {});
        for (size_t i = 0; i < block.size(); ++i) {
          if (b.features[i].verdict != kKept) continue;
          const bool duplicate = o.exact_dedup && !seen.insert(b.features[i].hash).second;
          const auto length = static_cast<int64_t>(block[i].text.size());
          tokenize[i] = !duplicate && length >= o.length.min_length && length <= hard_max;
        }
        parallel_for(block.size(), threads, [&](size_t i) {
          if (tokenize[i]) encode_document(*tokenizer, block[i], mine, b.tokens[i]);
        });
        for (size_t i = 0; i < block.size(); ++i)
          writer.add(static_cast<uint32_t>(first + block[i].file), block[i], b.features[i],
                     tokenize[i], b.tokens[i]);
        documents += static_cast<int64_t>(block.size());
        if (o.on_progress) {
          PrepareProgress p;
          p.documents = documents;
          p.bytes_read = b.bytes;
          p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          o.on_progress(p);
        }
      });
  if (stats.invalid > 0)
    log::warn("data", "{} invalid JSONL record(s) skipped; first: {}", stats.invalid,
              stats.first_invalid);
  nlohmann::json part = {
      {"format", kPartFormat},
      {"version", kPartVersion},
      {"created_by", std::string("keel ") + KEEL_VERSION},
      {"command", o.command},
      {"task", task},
      {"tasks", tasks},
      {"inputs", inputs},
      {"skipped_files", skipped},
      {"files", {first, end}},
      {"options", options_json(o)},
      {"tokenizer", tokenizer->describe()},
      {"documents", documents},
      {"bytes_in", stats.bytes},
      {"invalid_records", stats.invalid},
      {"first_invalid_record", stats.first_invalid},
      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()},
      {"threads", threads}};
  for (const char* name : {"tokenizer.model", "tokenizer.json"})
    if (fs::exists(fs::path(o.output) / name))
      part["tokenizer_file"] = {{"file", name}, {"xxh3", hex64(file_xxh3(o.output + "/" + name))}};
  part["payload"] = writer.finish(signature_words(o.minhash));
  std::ofstream out(o.output + "/part.json");
  out << part.dump(2) << "\n";
  if (!out.flush()) throw DataError(o.output + "/part.json: write failed; HINT: is the disk full?");
  return part;
}

}  // namespace

std::string part_name(int task, int tasks) {
  return fmt::format("part-{:05d}-of-{:05d}", task, tasks);
}

nlohmann::json prepare_part(const PrepareOptions& o, int task, int tasks) {
  if (tasks < 1 || task < 0 || task >= tasks)
    throw DataError("--task " + std::to_string(task) + " --tasks " + std::to_string(tasks) +
                    ": expected --tasks N >= 1 and 0 <= --task I < N");
  if (o.tokenizer.kind == TokenizerSpec::Kind::kSpmTrain)
    throw DataError("--tokenizer " + o.tokenizer.text() +
                    " with --tasks: a SentencePiece model trained on one task's share would "
                    "differ from task to task; HINT: train it once (keel prepare --tokenizer " +
                    o.tokenizer.text() +
                    " on a sample, which writes tokenizer.model), then give "
                    "every task --tokenizer spm:PATH/tokenizer.model");
  check_prepare_options(o);
  std::vector<std::string> skipped;
  const auto files = expand_inputs(o.inputs, o.input, &skipped);
  PrepareOptions part = o;
  part.output = (fs::path(o.output) / part_name(task, tasks)).string();
  check_prepare_output(part.output, o.overwrite);
  return write_staged(part, files, [&](const PrepareOptions& staged) {
    return write_part(staged, files, skipped, task, tasks);
  });
}

void encode_document(const Tokenizer& tokenizer, const Document& doc,
                     const std::vector<InputFile>& files, std::vector<uint32_t>& out) {
  try {
    tokenizer.encode(doc.text, out);
  } catch (const DataError& e) {
    const InputFile& f = files.at(static_cast<size_t>(doc.file));
    throw DataError(fmt::format(
        "{}:{}{}{}: this document cannot be tokenized: {}\nHINT: leave it out of the input (or "
        "shorten it: --max-length drops documents longer than a length)",
        f.path, f.parquet ? "row " : "", doc.line, doc.id.empty() ? "" : " (id " + doc.id + ")",
        e.what()));
  }
}

}  // namespace keel::data
