#include "data/provenance.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "data/file_header_check.h"
#include "data/headered_file.h"
#include "data/mapped_file.h"
#include "data/shard_format.h"

namespace keel::data {
namespace {

constexpr const char* kIndexName = "sources.idx";
constexpr const char* kIdsName = "sources.ids";
constexpr uint32_t kRecordBytes = 16;  // {uint64 line, uint64 id_end}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError(path + ": " + what + "; HINT: re-run `keel prepare` to rebuild the dataset");
}

// Checks a provenance file (the shared header check, then its entry size, count and checksum
// against meta.json's entry); returns the number of entries it holds.
uint64_t check_file(const MappedFile& f, const char (&magic)[8], uint32_t elem_bytes,
                    uint64_t want_count, const nlohmann::json& entry) {
  const std::string& path = f.path();
  const FileHeader h = check_file_header(f.data(), f.size(), path, magic, "provenance");
  if (h.elem_bytes != elem_bytes || h.count != want_count)
    fail(path, "holds " + std::to_string(h.count) + " entries of " + std::to_string(h.elem_bytes) +
                   " bytes, meta.json says " + std::to_string(want_count) + " of " +
                   std::to_string(elem_bytes));
  const std::string want = entry.value("xxh3", std::string());
  if (hex64(h.payload_xxh3) != want ||
      xxh3(f.data() + sizeof h, f.size() - sizeof h) != h.payload_xxh3)
    fail(path, "checksum mismatch (corrupt, or from another prepare)");
  return h.count;
}

}  // namespace

SourceWriter::SourceWriter(const std::string& dir)
    : index_(std::make_unique<HeaderedFileWriter>(dir + "/" + kIndexName)),
      ids_(std::make_unique<HeaderedFileWriter>(dir + "/" + kIdsName)) {}

SourceWriter::~SourceWriter() = default;

void SourceWriter::add(int64_t line, std::string_view id) {
  ids_->put(id.data(), id.size());
  id_end_ += id.size();
  const uint64_t record[2] = {static_cast<uint64_t>(line), id_end_};
  index_->put(record, sizeof record);
  ++records_;
}

nlohmann::json SourceWriter::finish() {
  const uint64_t index_hash = index_->close(kSourcesMagic, kRecordBytes, records_);
  const uint64_t ids_hash = ids_->close(kSourceIdsMagic, 1, id_end_);
  return {{"index", {{"file", kIndexName}, {"records", records_}, {"xxh3", hex64(index_hash)}}},
          {"ids", {{"file", kIdsName}, {"bytes", id_end_}, {"xxh3", hex64(ids_hash)}}}};
}

Provenance::~Provenance() = default;

std::unique_ptr<Provenance> Provenance::open(const std::string& dir, const nlohmann::json& meta) {
  std::unique_ptr<Provenance> p(new Provenance());
  if (const auto inputs = meta.find("inputs"); inputs != meta.end() && inputs->is_array())
    for (const auto& in : *inputs)
      if (in.is_object() && in.contains("path") && in["path"].is_string() &&
          in.value("documents", int64_t{1}) > 0)
        p->inputs_.push_back({in.value("first_doc", int64_t{0}), in["path"].get<std::string>(),
                              in.value("format", std::string()) == "parquet"});
  std::stable_sort(p->inputs_.begin(), p->inputs_.end(),
                   [](const Input& a, const Input& b) { return a.first_doc < b.first_doc; });
  const auto sources = meta.find("sources");
  if (sources == meta.end() || !sources->is_object()) return p;
  try {
    const auto& index = sources->at("index");
    const auto& ids = sources->at("ids");
    p->index_ = std::make_unique<MappedFile>(dir + "/" + kIndexName);
    p->ids_ = std::make_unique<MappedFile>(dir + "/" + kIdsName);
    p->count_ = check_file(*p->index_, kSourcesMagic, kRecordBytes,
                           index.at("records").get<uint64_t>(), index);
    p->id_size_ = check_file(*p->ids_, kSourceIdsMagic, 1, ids.at("bytes").get<uint64_t>(), ids);
  } catch (const nlohmann::json::exception& e) {
    fail(dir + "/meta.json", std::string("malformed 'sources' (") + e.what() + ")");
  }
  p->records_ = p->index_->data() + sizeof(FileHeader);
  p->id_bytes_ = reinterpret_cast<const char*>(p->ids_->data() + sizeof(FileHeader));
  return p;
}

nlohmann::json Provenance::where(uint64_t doc_id) const {
  nlohmann::json out = nlohmann::json::object();
  auto it = std::upper_bound(inputs_.begin(), inputs_.end(), static_cast<int64_t>(doc_id),
                             [](int64_t id, const Input& in) { return id < in.first_doc; });
  if (it == inputs_.begin()) return out;
  const Input& input = *std::prev(it);
  out["file"] = input.path;
  if (doc_id >= count_) return out;
  uint64_t record[2], begin = 0;
  std::memcpy(record, records_ + doc_id * kRecordBytes, sizeof record);
  if (doc_id > 0) std::memcpy(&begin, records_ + (doc_id - 1) * kRecordBytes + 8, 8);
  out[input.parquet ? "row" : "line"] = record[0];
  if (begin < record[1] && record[1] <= id_size_)
    out["id"] = std::string(id_bytes_ + begin, record[1] - begin);
  return out;
}

}  // namespace keel::data
