// `keel prepare --merge` (data/prepare_parts.h): every part checked, then the dedup decisions over
// all of them in corpus order, and the kept documents' tokens packed into the dataset.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "common/error.h"
#include "common/log.h"
#include "common/paths.h"
#include "data/file_header_check.h"
#include "data/mapped_file.h"
#include "data/part_format.h"
#include "data/prepare_parts.h"
#include "data/prepare_passes.h"
#include "data/shard_format.h"
#include "data/tokenizer.h"

namespace keel::data {
namespace fs = std::filesystem;
namespace {

// What differs between a part's `key` and the first part's, in words: the option and both values
// (a few of them), or the input lists' sizes.
std::string difference(const std::string& key, const nlohmann::json& mine,
                       const nlohmann::json& first, const std::string& first_name) {
  if (mine.is_object() && first.is_object()) {
    std::string out;
    int named = 0;
    for (const auto& [k, v] : mine.items()) {
      const nlohmann::json other = first.value(k, nlohmann::json());
      if (v == other || ++named > 3) continue;
      out += (out.empty() ? "" : "; ") +
             fmt::format("its {}.{} is {}, {}'s {}", key, k, v.dump(), first_name, other.dump());
    }
    for (const auto& [k, v] : first.items())
      if (!mine.contains(k) && ++named <= 3)
        out += (out.empty() ? "" : "; ") +
               fmt::format("its {} has no {} ({}'s is {})", key, k, first_name, v.dump());
    if (!out.empty()) return out;
  }
  if (mine.is_array() && first.is_array() && mine.size() != first.size())
    return fmt::format("its '{}' lists {} entries, {}'s {}", key, mine.size(), first_name,
                       first.size());
  return "its '" + key + "' differs from " + first_name + "'s";
}

[[noreturn]] void refuse_part(const fs::path& path, const std::string& what) {
  throw DataError(path.string() + ": " + what +
                  "; HINT: run that task again (keel prepare ... --task I --tasks N --overwrite)");
}

// A part opened for the merge: part.json read and every payload file mapped and checked.
struct Part {
  fs::path dir;
  nlohmann::json json;
  std::vector<std::unique_ptr<MappedFile>> files;
  uint64_t entries[4] = {};
  size_t first = 0, end = 0;  // its input files
  uint32_t token_bytes = 4;   // of tokens.bin's entries

  template <class T>
  const T* payload(int k) const {
    return reinterpret_cast<const T*>(files[k]->data() + sizeof(FileHeader));
  }
  PartRecord record(uint64_t k) const {
    PartRecord r;
    std::memcpy(&r, payload<uint8_t>(0) + k * sizeof r, sizeof r);
    return r;
  }
};

Part open_part(const fs::path& dir, int task, int tasks) {
  Part p;
  p.dir = dir;
  const fs::path json_path = dir / "part.json";
  try {
    std::ifstream in(json_path);
    if (!in) refuse_part(json_path, "missing (the task did not finish)");
    p.json = nlohmann::json::parse(in);
    const int version = p.json.at("version").get<int>();
    if (p.json.at("format") != kPartFormat || version < 1 || version > kPartVersion)
      refuse_part(json_path, std::string("not a ") + kPartFormat + " of version 1 to " +
                                 std::to_string(kPartVersion));
    if (p.json.at("task") != task || p.json.at("tasks") != tasks)
      refuse_part(json_path, "says task " + p.json.at("task").dump() + " of " +
                                 p.json.at("tasks").dump() + ", its name " +
                                 part_name(task, tasks));
    p.first = p.json.at("files").at(0).get<size_t>();
    p.end = p.json.at("files").at(1).get<size_t>();
    for (int k = 0; k < 4; ++k) {
      const auto& entry = p.json.at("payload").at(kPayload[k].name);
      p.files.push_back(std::make_unique<MappedFile>((dir / kPayload[k].name).string(),
                                                     "is every task's part complete?"));
      const MappedFile& f = *p.files.back();
      const FileHeader h =
          check_file_header(f.data(), f.size(), f.path(), kPayload[k].magic, "prepare part");
      p.entries[k] = entry.at("entries").get<uint64_t>();
      const uint32_t elem =
          k == 2 ? token_bytes_for(p.json.at("tokenizer").at("vocab_size").get<int64_t>())
                 : kPayload[k].elem_bytes;
      if (k == 2) p.token_bytes = elem;
      if (h.elem_bytes != elem || h.count != p.entries[k])
        refuse_part(f.path(), "holds " + std::to_string(h.count) + " entries, part.json says " +
                                  std::to_string(p.entries[k]));
      if (hex64(h.payload_xxh3) != entry.at("xxh3").get<std::string>() ||
          xxh3(f.data() + sizeof h, f.size() - sizeof h) != h.payload_xxh3)
        refuse_part(f.path(), "checksum mismatch (corrupt, or from another run of the task)");
    }
  } catch (const nlohmann::json::exception& e) {
    refuse_part(json_path, std::string("malformed (") + e.what() + ")");
  }
  return p;
}

// Every part of `parts_dir`, in task order, each checked, all from the same inputs and options.
std::vector<Part> open_parts(const std::string& parts_dir) {
  std::error_code ec;
  if (!fs::is_directory(parts_dir, ec))
    throw DataError("--merge " + parts_dir + ": no such directory" + relative_note(parts_dir));
  const std::regex name_re("part-([0-9]{5})-of-([0-9]{5})");
  std::map<int, fs::path> found;
  int tasks = 0;
  for (const auto& e : fs::directory_iterator(parts_dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !std::regex_match(name, m, name_re)) continue;
    const int n = std::stoi(m[2]);
    if (tasks != 0 && n != tasks)
      throw DataError("--merge " + parts_dir + ": holds parts of " + std::to_string(tasks) +
                      " and of " + std::to_string(n) + " tasks (" + name +
                      "); HINT: keep one split's parts in a directory");
    tasks = n;
    found[std::stoi(m[1])] = e.path();
  }
  if (found.empty())
    throw DataError("--merge " + parts_dir + ": holds no part (part-NNNNN-of-NNNNN); HINT: run " +
                    "keel prepare --task I --tasks N --output " + parts_dir +
                    " for each task first");
  std::string missing;
  for (int t = 0; t < tasks; ++t)
    if (!found.count(t)) missing += (missing.empty() ? "" : ", ") + std::to_string(t);
  if (!missing.empty() || static_cast<int>(found.size()) != tasks)
    throw DataError("--merge " + parts_dir + ": task(s) " + missing + " of " +
                    std::to_string(tasks) + " have no part; HINT: run them (keel prepare ... " +
                    "--task I --tasks " + std::to_string(tasks) + ") and merge again");
  std::vector<Part> parts;
  for (const auto& [task, dir] : found) {
    parts.push_back(open_part(dir, task, tasks));
    const Part& p = parts.back();
    const Part& p0 = parts.front();
    for (const char* key : {"inputs", "skipped_files", "options", "tokenizer", "tokenizer_file"})
      if (p.json.value(key, nlohmann::json()) != p0.json.value(key, nlohmann::json()))
        refuse_part(dir / "part.json",
                    difference(key, p.json.value(key, nlohmann::json()),
                               p0.json.value(key, nlohmann::json()), part_name(0, tasks)) +
                        ": every task must be run on the same inputs with the same options");
    const size_t want_first = parts.size() == 1 ? 0 : parts[parts.size() - 2].end;
    if (p.first != want_first || p.end < p.first || p.end > p0.json["inputs"].size())
      refuse_part(dir / "part.json", "its input files do not follow the previous part's");
  }
  if (parts.back().end != parts.front().json["inputs"].size())
    refuse_part(parts.back().dir / "part.json", "the parts do not cover every input file");
  return parts;
}

// Pass 1 of the merge: the decisions over every part's documents, in corpus order.
DedupResult decide_parts(const PrepareOptions& o, const std::vector<Part>& parts, size_t files) {
  DedupResult r;
  const auto start = std::chrono::steady_clock::now();
  const auto np = static_cast<size_t>(signature_words(o.minhash));
  int64_t bytes = 0;  // of text decided on
  DedupDecider decider(o, r, files);
  for (const Part& p : parts) {
    const auto* sigs = p.payload<uint32_t>(1);
    const auto* ids = p.payload<char>(3);
    uint64_t sig = 0, id_begin = 0;
    for (uint64_t k = 0; k < p.entries[0]; ++k) {
      const PartRecord rec = p.record(k);
      if (rec.file < p.first || rec.file >= p.end || rec.id_end < id_begin ||
          rec.id_end > p.entries[3] || (rec.has_signature && (sig + 1) * np > p.entries[1]))
        refuse_part(p.dir / "documents.bin", "document " + std::to_string(k) + " is inconsistent");
      DocumentFeatures f;
      f.verdict = rec.verdict;
      f.hash = rec.hash;
      if (rec.has_signature) f.signature.assign(sigs + sig * np, sigs + (sig + 1) * np), ++sig;
      decider.decide(rec.file, rec.length, rec.line,
                     std::string_view(ids + id_begin, rec.id_end - id_begin), f);
      id_begin = rec.id_end;
      bytes += rec.length;
      if (o.on_progress && (k % 4096 == 4095 || k + 1 == p.entries[0])) {
        PrepareProgress progress;
        progress.documents = static_cast<int64_t>(r.status.size());
        progress.bytes_read = bytes;
        progress.seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        o.on_progress(progress);
      }
    }
    r.bytes_in += p.json.at("bytes_in").get<int64_t>();
    r.invalid += p.json.at("invalid_records").get<int64_t>();
    if (r.first_invalid.empty()) r.first_invalid = p.json.at("first_invalid_record");
  }
  decider.finish();
  return r;
}

// Pass 2 of the merge: the kept documents' tokens, from the parts, packed into shards.
PackResult pack_parts(const PrepareOptions& o, const std::vector<Part>& parts,
                      const DedupResult& dedup, const LengthFilter& length_filter,
                      const Tokenizer& tokenizer) {
  PackResult r;
  Packer packer(o, tokenizer, r);
  const auto start = std::chrono::steady_clock::now();
  int64_t id = 0;
  for (const Part& p : parts) {
    const bool narrow = p.token_bytes == 2;
    const auto* tokens = p.payload<uint32_t>(2);
    const auto* tokens16 = p.payload<uint16_t>(2);
    std::vector<uint32_t> wide;
    uint64_t begin = 0;
    for (uint64_t k = 0; k < p.entries[0]; ++k, ++id) {
      const PartRecord rec = p.record(k);
      if (rec.tokens_end < begin || rec.tokens_end > p.entries[2])
        refuse_part(p.dir / "documents.bin", "document " + std::to_string(k) + " is inconsistent");
      if (dedup.status[id] == kKept && length_filter.keep(rec.length)) {
        if (!rec.tokenized)
          refuse_part(p.dir / "documents.bin", "document " + std::to_string(k) +
                                                   " is kept but its task did not tokenize it");
        if (narrow) wide.assign(tokens16 + begin, tokens16 + rec.tokens_end);
        packer.add(static_cast<uint64_t>(id),
                   narrow ? std::span<const uint32_t>(wide)
                          : std::span<const uint32_t>(tokens + begin, rec.tokens_end - begin),
                   dedup.clusters[id]);
      }
      begin = rec.tokens_end;
    }
    if (o.on_progress) {
      PrepareProgress progress;
      progress.pass = 2;
      progress.documents = id;
      progress.tokens_out = r.tokens_out;
      progress.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      o.on_progress(progress);
    }
  }
  packer.finish();
  return r;
}

nlohmann::json merge_into(const PrepareOptions& o, const std::vector<Part>& parts,
                          const std::vector<InputFile>& files,
                          const std::vector<std::string>& skipped) {
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = cpu_seconds();
  const DedupResult dedup = decide_parts(o, parts, files.size());
  if (dedup.invalid > 0)
    log::warn("data", "{} invalid JSONL record(s) skipped; first: {}", dedup.invalid,
              dedup.first_invalid);
  const LengthFilter length_filter(o.length, dedup.kept_lengths());
  PrepareTiming timing;
  timing.threads = worker_threads(o);
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(o, "", timing.threads);
  const PackResult packed = pack_parts(o, parts, dedup, length_filter, *tokenizer);
  timing.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  timing.cpu_seconds = cpu_seconds() - cpu0;
  nlohmann::json commands = nlohmann::json::array();
  for (const Part& p : parts) commands.push_back(p.json.at("command"));
  const nlohmann::json extra = {
      {"merged_parts", {{"tasks", parts.size()}, {"commands", commands}}}};
  return write_reports_and_meta(o, files, skipped, dedup, length_filter, packed, *tokenizer, timing,
                                extra);
}

}  // namespace

nlohmann::json merge_parts(const std::string& parts_dir, const PrepareOptions& cli) {
  if (cli.output.empty()) throw DataError("--output: a directory is required");
  check_prepare_output(cli.output, cli.overwrite);
  const std::vector<Part> parts = open_parts(parts_dir);
  PrepareOptions o = options_from(parts.front().json.at("options"), parts.front().dir);
  o.output = cli.output;
  o.overwrite = cli.overwrite;
  o.threads = cli.threads;
  o.command = cli.command;
  o.on_progress = cli.on_progress;
  std::vector<InputFile> files;
  for (const auto& in : parts.front().json.at("inputs"))
    files.push_back({in.at("path").get<std::string>(), in.at("format") == "jsonl",
                     in.at("format") == "parquet"});
  const auto skipped = parts.front().json.at("skipped_files").get<std::vector<std::string>>();
  if (lies_inside(parts_dir, cli.output))
    throw DataError("--merge " + parts_dir + " lies inside --output " + cli.output +
                    ", which the dataset replaces whole; HINT: keep the parts beside the dataset");
  return write_staged(o, files, [&](const PrepareOptions& staged) {
    return merge_into(staged, parts, files, skipped);
  });
}

}  // namespace keel::data
