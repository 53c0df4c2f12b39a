#include "data/shard_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/paths.h"
#include "data/file_header_check.h"
#include "data/mapped_file.h"

namespace keel::data {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what,
                       const std::string& hint = "re-run `keel prepare` to rebuild the dataset") {
  throw DataError(path + ": " + what + "; HINT: " + hint);
}

uint64_t parse_hex(const nlohmann::json& j, const std::string& path, const char* key) {
  if (!j.is_string()) fail(path, std::string("'") + key + "' must be a hex string");
  auto s = j.get<std::string>();
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail(path, std::string("'") + key + "' is not a 16-digit lowercase hex checksum: '" + s + "'");
  return std::stoull(s, nullptr, 16);
}

std::string get_string(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t get_count(const nlohmann::json& obj, const char* key, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path, std::string("missing key '") + key + "'");
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    fail(path, std::string("'") + key + "' must be a non-negative integer");
  return it->get<int64_t>();
}

std::string get_file_name(const nlohmann::json& obj, const std::string& path) {
  auto it = obj.find("file");
  if (it == obj.end() || !it->is_string()) fail(path, "an entry lacks a string 'file'");
  auto name = it->get<std::string>();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    fail(path, "file name '" + name + "' must be a plain name inside the dataset directory");
  return name;
}

std::string what_magic(const uint8_t* data, size_t size) {
  std::string s;
  for (size_t i = 0; i < std::min<size_t>(size, 8); ++i)
    s += (data[i] >= 32 && data[i] < 127) ? static_cast<char>(data[i]) : '?';
  return s;
}

}  // namespace

FileHeader check_file_header(const uint8_t* data, size_t size, const std::string& path,
                             const char (&magic)[8], const char* kind) {
  if (size < sizeof(FileHeader))
    fail(path, "truncated: " + std::to_string(size) + " bytes, shorter than the 64-byte " + kind +
                   " header");
  FileHeader h;
  std::memcpy(&h, data, sizeof h);
  if (std::memcmp(h.magic, magic, 8) != 0)
    fail(path,
         std::string("not a keel ") + kind + " file (magic '" + what_magic(data, size) + "')");
  if (h.version != kShardFormatVersion)
    fail(path,
         "format version " + std::to_string(h.version) + ", this keel reads version " +
             std::to_string(kShardFormatVersion),
         "prepare the data with this keel, or use the keel that wrote it");
  if (xxh3(&h, offsetof(FileHeader, header_xxh3)) != h.header_xxh3)
    fail(path, "header checksum mismatch (the header is corrupt)");
  if (h.elem_bytes == 0) fail(path, "entry size 0 in the header (the header is corrupt)");
  bool truncated = (size - sizeof h) / h.elem_bytes < h.count;
  if (truncated || (size - sizeof h) != h.count * h.elem_bytes) {
    fail(path, std::string(truncated ? "truncated" : "wrong size") + ": header says " +
                   std::to_string(h.count) + " entries of " + std::to_string(h.elem_bytes) +
                   " bytes, the file holds " + std::to_string(size - sizeof h) + " payload bytes");
  }
  return h;
}

DatasetMeta parse_meta(std::string_view text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(path, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail(path, "not a JSON object");
  if (get_string(j, "format") != kMetaFormatName)
    fail(path, "not a keel dataset (format is not '" + std::string(kMetaFormatName) + "')",
         "point data.path at a directory written by `keel prepare`");
  if (get_count(j, "version", path) != kShardFormatVersion)
    fail(path,
         "dataset format version " + j["version"].dump() + ", this keel reads version " +
             std::to_string(kShardFormatVersion),
         "prepare the data with this keel");
  DatasetMeta m;
  m.vocab_size = get_count(j, "vocab_size", path);
  if (m.vocab_size < 1 || m.vocab_size > (int64_t{1} << 32)) fail(path, "vocab_size out of range");
  auto dtype = get_string(j, "token_dtype");
  if (dtype == "uint16")
    m.token_bytes = 2;
  else if (dtype == "uint32")
    m.token_bytes = 4;
  else
    fail(path, "token_dtype '" + dtype + "' is neither uint16 nor uint32");
  if (m.token_bytes == 2 && m.vocab_size > 65536)
    fail(path, "vocab_size " + std::to_string(m.vocab_size) + " does not fit uint16 tokens");
  m.boundary_id = static_cast<uint32_t>(get_count(j, "boundary_id", path));
  if (m.boundary_id >= m.vocab_size) fail(path, "boundary_id is not below vocab_size");
  m.seq_len = j.contains("seq_len") ? get_count(j, "seq_len", path) : 0;
  if (j.contains("tokenizer")) m.tokenizer = j["tokenizer"];
  m.provenance = nlohmann::json::object();
  for (const char* key : {"inputs", "sources"})
    if (j.contains(key)) m.provenance[key] = j[key];
  if (!m.tokenizer.is_object()) fail(path, "missing 'tokenizer' object");
  auto splits = j.find("splits");
  if (splits == j.end() || !splits->is_object() || splits->empty())
    fail(path, "missing 'splits' (train/val)");
  for (auto& [name, s] : splits->items()) {
    if (!s.is_object()) fail(path, "split '" + name + "' is not an object");
    SplitMeta sm;
    auto shards = s.find("shards");
    if (shards == s.end() || !shards->is_array()) fail(path, "split '" + name + "' lacks 'shards'");
    int64_t sum = 0;
    for (auto& e : *shards) {
      if (!e.is_object()) fail(path, "split '" + name + "': a shard entry is not an object");
      ShardEntry se{get_file_name(e, path), get_count(e, "tokens", path), 0};
      if (!e.contains("xxh3")) fail(path, "shard '" + se.file + "' has no xxh3 checksum");
      se.xxh3 = parse_hex(e["xxh3"], path, "xxh3");
      if (se.tokens > (int64_t{1} << 40))
        fail(path, "shard '" + se.file + "' token count too large");
      sum += se.tokens;
      sm.shards.push_back(se);
    }
    sm.tokens = get_count(s, "tokens", path);
    if (sm.tokens != sum)
      fail(path, "split '" + name + "' says " + std::to_string(sm.tokens) +
                     " tokens but its shards add up to " + std::to_string(sum));
    auto index = s.find("index");
    if (index == s.end() || !index->is_object()) fail(path, "split '" + name + "' lacks 'index'");
    sm.index_file = get_file_name(*index, path);
    sm.records = get_count(*index, "records", path);
    if (!index->contains("xxh3")) fail(path, "index of split '" + name + "' has no xxh3");
    sm.index_xxh3 = parse_hex((*index)["xxh3"], path, "xxh3");
    m.splits[name] = std::move(sm);
  }
  return m;
}

FileHeader check_shard_bytes(const uint8_t* data, size_t size, const std::string& path,
                             const ShardEntry& expect, uint32_t token_bytes, int64_t vocab_size) {
  FileHeader h = check_file_header(data, size, path, kShardMagic, "token shard");
  if (h.elem_bytes != token_bytes)
    fail(path, std::to_string(h.elem_bytes) + "-byte tokens, meta.json says " +
                   std::to_string(token_bytes) + " (mismatched dataset)");
  if (static_cast<int64_t>(h.count) != expect.tokens)
    fail(path, "holds " + std::to_string(h.count) + " tokens, meta.json says " +
                   std::to_string(expect.tokens) + " (mismatched or replaced shard)");
  if (static_cast<int64_t>(h.aux) != vocab_size)
    fail(path, "written for vocab size " + std::to_string(h.aux) + ", meta.json says " +
                   std::to_string(vocab_size) + " (mismatched dataset)");
  if (h.payload_xxh3 != expect.xxh3)
    fail(path, "checksum " + hex64(h.payload_xxh3) + " in the header differs from meta.json's " +
                   hex64(expect.xxh3) + " (mismatched or replaced shard)");
  const uint8_t* payload = data + sizeof h;
  uint64_t actual = xxh3(payload, size - sizeof h);
  if (actual != h.payload_xxh3)
    fail(path, "payload checksum mismatch: computed " + hex64(actual) + ", expected " +
                   hex64(h.payload_xxh3) + " (the shard is corrupt)");
  uint32_t max_token = 0;
  if (token_bytes == 2) {
    for (uint64_t i = 0; i < h.count; ++i)
      max_token = std::max<uint32_t>(max_token, payload[2 * i] | (payload[2 * i + 1] << 8));
  } else {
    for (uint64_t i = 0; i < h.count; ++i) {
      uint32_t v;
      std::memcpy(&v, payload + 4 * i, 4);
      max_token = std::max(max_token, v);
    }
  }
  if (h.count > 0 && max_token >= vocab_size)
    fail(path, "token id " + std::to_string(max_token) + " is outside the vocabulary (size " +
                   std::to_string(vocab_size) + ")");
  return h;
}

std::vector<IndexRecord> check_index_bytes(const uint8_t* data, size_t size,
                                           const std::string& path, const SplitMeta& expect) {
  FileHeader h = check_file_header(data, size, path, kIndexMagic, "document index");
  if (h.elem_bytes != sizeof(IndexRecord))
    fail(path, "records of " + std::to_string(h.elem_bytes) + " bytes, expected " +
                   std::to_string(sizeof(IndexRecord)));
  if (static_cast<int64_t>(h.count) != expect.records)
    fail(path, "holds " + std::to_string(h.count) + " documents, meta.json says " +
                   std::to_string(expect.records));
  if (static_cast<int64_t>(h.aux) != expect.tokens)
    fail(path, "indexes " + std::to_string(h.aux) + " tokens, the shards hold " +
                   std::to_string(expect.tokens) + " (mismatched index)");
  if (h.payload_xxh3 != expect.index_xxh3)
    fail(path, "checksum differs from meta.json's (mismatched or replaced index)");
  if (xxh3(data + sizeof h, size - sizeof h) != h.payload_xxh3)
    fail(path, "payload checksum mismatch (the index is corrupt)");
  std::vector<IndexRecord> records(h.count);
  if (h.count) std::memcpy(records.data(), data + sizeof h, h.count * sizeof(IndexRecord));
  uint64_t next_free = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    if (r.offset < next_free || r.offset > h.aux || h.aux - r.offset < uint64_t{r.length} + 1 ||
        (i > 0 && r.doc_id <= records[i - 1].doc_id))
      fail(path, "document record " + std::to_string(i) +
                     " overlaps its predecessor or lies outside the token stream");
    next_free = r.offset + r.length + 1;
  }
  return records;
}

namespace {

// Where to suggest `keel prepare` writes the dataset for raw text in `dir`: beside it, never into
// it (that would write into the corpus).
std::string prepared_name_for(const fs::path& dir) {
  fs::path d = dir.lexically_normal();
  if (d.filename().empty()) d = d.parent_path();
  return (d.parent_path() / (d.filename().string() + "-prepared")).string();
}

// Why `dir` holds no meta.json, in words, with the hint that fixes it.
[[noreturn]] void fail_no_dataset(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fail(path, "the dataset directory does not exist" + relative_note(dir),
         "run `keel prepare --input RAW_TEXT --output " + dir + "` first");
  }
  if (!fs::is_directory(dir, ec))
    fail(dir, "is a file, not a dataset directory",
         "`keel prepare --input " + dir + " --output " + prepared_name_for(dir) +
             "` makes one from it; set data.path to that directory");
  // What is there: shards without meta.json are an unfinished or older prepare; anything else is
  // most likely the raw corpus itself.
  int64_t shards = 0, other = 0;
  std::string example;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const auto ext = e.path().extension().string();
    if (ext == ".bin" || ext == ".idx") {
      ++shards;
    } else {
      if (example.empty()) example = e.path().string();
      ++other;
    }
    if (shards + other >= 10000) break;
  }
  if (shards > 0 && other <= 3)
    fail(path,
         "missing: the directory holds shards but no meta.json (an interrupted `keel prepare`?)",
         "re-run `keel prepare` with --output " + dir + " --overwrite");
  if (other > 0)
    fail(path,
         "missing: " + dir + " is not a prepared dataset; it holds " + std::to_string(other) +
             " other file(s), such as " + example + " (raw text?)",
         "prepare it into another directory: `keel prepare --input " + dir + " --output " +
             prepared_name_for(dir) + "`, then set data.path to " + prepared_name_for(dir));
  fail(path, "missing: " + dir + " is empty",
       "run `keel prepare --input RAW_TEXT --output " + dir + "` first");
}

std::string read_meta_text(const std::string& dir) {
  std::string path = dir + "/meta.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_no_dataset(dir);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

ShardSet::~ShardSet() = default;

std::unique_ptr<ShardSet> ShardSet::open(const std::string& dir, const std::string& split) {
  std::unique_ptr<ShardSet> set(new ShardSet());
  set->dir_ = dir;
  set->split_ = split;
  set->meta_ = parse_meta(read_meta_text(dir), dir + "/meta.json");
  auto it = set->meta_.splits.find(split);
  if (it == set->meta_.splits.end())
    fail(dir + "/meta.json", "has no '" + split + "' split",
         split == "val" ? "prepare with --val-fraction, or set data.val_path"
                        : "re-run `keel prepare`");
  const SplitMeta& sm = it->second;
  int64_t start = 0;
  for (const auto& e : sm.shards) {
    auto file = std::make_shared<const MappedFile>(dir + "/" + e.file);
    check_shard_bytes(file->data(), file->size(), dir + "/" + e.file, e, set->meta_.token_bytes,
                      set->meta_.vocab_size);
    set->starts_.push_back(start);
    set->payloads_.push_back(file->data() + sizeof(FileHeader));
    set->files_.push_back(std::move(file));
    start += e.tokens;
  }
  set->starts_.push_back(start);
  set->total_tokens_ = start;
  MappedFile index(dir + "/" + sm.index_file);
  set->index_ = check_index_bytes(index.data(), index.size(), dir + "/" + sm.index_file, sm);
  return set;
}

std::unique_ptr<ShardSet> ShardSet::from_parts(std::string dir, std::string split, DatasetMeta meta,
                                               std::vector<StreamPart> parts,
                                               std::vector<IndexRecord> index) {
  std::unique_ptr<ShardSet> set(new ShardSet());
  SplitMeta sm;
  int64_t start = 0;
  for (auto& part : parts) {
    sm.shards.push_back({part.name, part.tokens, 0});
    set->starts_.push_back(start);
    set->payloads_.push_back(part.payload);
    set->files_.push_back(std::move(part.file));
    start += part.tokens;
  }
  set->starts_.push_back(start);
  set->total_tokens_ = start;
  sm.tokens = start;
  sm.records = static_cast<int64_t>(index.size());
  meta.splits[split] = std::move(sm);
  set->dir_ = std::move(dir);
  set->split_ = std::move(split);
  set->meta_ = std::move(meta);
  set->index_ = std::move(index);
  return set;
}

void ShardSet::read(int64_t start, int64_t count, int64_t* out) const {
  if (start < 0 || count < 0 || start + count > total_tokens_)
    throw std::out_of_range("ShardSet::read past the end of the token stream");
  size_t s = std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1;
  const uint32_t tb = meta_.token_bytes;
  while (count > 0) {
    int64_t local = start - starts_[s];
    int64_t n = std::min(count, starts_[s + 1] - start);
    const uint8_t* p = payloads_[s] + local * tb;
    if (tb == 2) {
      for (int64_t i = 0; i < n; ++i) out[i] = p[2 * i] | (p[2 * i + 1] << 8);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        uint32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = v;
      }
    }
    out += n;
    start += n;
    count -= n;
    ++s;
  }
}

std::pair<std::string, int64_t> ShardSet::shard_at(int64_t pos) const {
  if (pos < 0 || pos >= total_tokens_) return {"", -1};
  const size_t s = std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin() - 1;
  return {meta_.splits.at(split_).shards.at(s).file, pos - starts_[s]};
}

int64_t ShardSet::document_at(int64_t pos) const {
  auto it = std::upper_bound(index_.begin(), index_.end(), static_cast<uint64_t>(pos),
                             [](uint64_t p, const IndexRecord& r) { return p < r.offset; });
  return static_cast<int64_t>(it - index_.begin()) - 1;
}

DatasetMeta read_meta(const std::string& dir) {
  return parse_meta(read_meta_text(dir), dir + "/meta.json");
}

int64_t shard_vocab_size(const std::string& dir) {
  return parse_meta(read_meta_text(dir), dir + "/meta.json").vocab_size;
}

}  // namespace keel::data
