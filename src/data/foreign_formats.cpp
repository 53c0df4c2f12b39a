#include "data/foreign_formats.h"

#include <glob.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/log.h"
#include "data/mapped_file.h"

namespace keel::data {
namespace fs = std::filesystem;
namespace {

constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;
constexpr int32_t kLlmcMagicU16 = 20240520, kLlmcMagicU32 = 20240801;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

[[noreturn]] void fail(const std::string& path, const std::string& what, const std::string& hint) {
  throw DataError(path + ": " + what + "; HINT: " + hint);
}

std::string at_byte(size_t offset) { return "byte " + std::to_string(offset) + ": "; }

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

const char* kMegatronHint =
    "data.path must be the prefix of a .bin/.idx pair written by Megatron-LM's "
    "preprocess_data.py (IndexedDatasetBuilder); rewrite the pair if it was damaged";
const char* kLlmcHint =
    "data.path must name .bin shards written by llm.c's dev/data scripts (write_datafile); "
    "rewrite the shard if it was damaged";

// A stream assembled from files, before its documents are known.
struct Stream {
  std::string dir;
  std::vector<StreamPart> parts;
  uint32_t token_bytes = 2;
  int64_t tokens = 0;
};

void add_part(Stream& s, std::shared_ptr<const MappedFile> file, size_t payload_offset,
              int64_t tokens) {
  if (tokens == 0) return;
  StreamPart part;
  part.name = fs::path(file->path()).lexically_relative(s.dir).string();
  part.payload = file->data() + payload_offset;
  part.tokens = tokens;
  part.file = std::move(file);
  s.parts.push_back(std::move(part));
  s.tokens += tokens;
}

// The parts that cover stream positions [lo, hi), renamed nothing, sliced where needed.
std::vector<StreamPart> slice(const Stream& s, int64_t lo, int64_t hi) {
  std::vector<StreamPart> out;
  int64_t start = 0;
  for (const auto& p : s.parts) {
    const int64_t end = start + p.tokens;
    const int64_t a = std::max(lo, start), b = std::min(hi, end);
    if (a < b) {
      StreamPart q = p;
      q.payload = p.payload + (a - start) * s.token_bytes;
      q.tokens = b - a;
      out.push_back(std::move(q));
    }
    start = end;
  }
  return out;
}

DatasetMeta stream_meta(const Stream& s, int64_t vocab_size, uint32_t boundary,
                        config::DataSource format) {
  DatasetMeta m;
  m.vocab_size = vocab_size;
  m.token_bytes = s.token_bytes;
  m.boundary_id = boundary;
  m.tokenizer = {{"kind", "ids"},
                 {"vocab_size", vocab_size},
                 {"boundary_id", boundary},
                 {"source", config::name_of(format)}};
  return m;
}

// One pass over the stream's tokens: each is checked against the vocabulary (the first outside it
// named by file and offset), each document hashed for its cluster. Megatron hands in its documents'
// first positions (`starts`); llmc's (delimiter >= 0) are found here.
struct Scan {
  std::vector<int64_t> starts;     // one per document, then the end
  std::vector<uint32_t> clusters;  // one per document
  int64_t common_last = -2;        // the token every non-empty document ends with; -1: none
};

[[noreturn]] void fail_token(const ShardSet& whole, int64_t pos, int64_t id, int64_t vocab_size) {
  const auto [file, offset] = whole.shard_at(pos);
  throw DataError(whole.dir() + "/" + file + ": token " + std::to_string(offset) + " is id " +
                  std::to_string(id) + ", outside the model's vocabulary (size " +
                  std::to_string(vocab_size) +
                  "); HINT: set model.vocab_size to the tokenizer's (50257 for GPT-2's, 128256 "
                  "for Llama 3's), or the file is damaged");
}

Scan scan_stream(const ShardSet& whole, int64_t vocab_size, std::vector<int64_t> starts,
                 int64_t delimiter) {
  Scan scan;
  const bool find = delimiter >= 0;
  if (find) starts = {0};
  const int64_t n = whole.num_tokens();
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<int64_t> buf(static_cast<size_t>(std::min(n, kChunk)));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  int64_t last = -1;
  auto close_doc = [&](bool empty) {
    scan.clusters.push_back(static_cast<uint32_t>(XXH3_64bits_digest(state)));
    XXH3_64bits_reset(state);
    if (!empty) scan.common_last = scan.common_last == -2 || scan.common_last == last ? last : -1;
  };
  size_t k = 0;  // the document being read (megatron)
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t count = std::min(kChunk, n - at);
    whole.read(at, count, buf.data());
    for (int64_t i = 0; i < count; ++i) {
      const int64_t pos = at + i, v = buf[i];
      if (v >= vocab_size) fail_token(whole, pos, v, vocab_size);
      if (find) {
        if (v == delimiter) {
          if (pos > 0) {
            close_doc(false);
            starts.push_back(pos);
          }
          last = v;
          continue;  // a document's cluster is its content's, without the delimiter
        }
      } else {
        for (; k + 1 < starts.size() && starts[k + 1] == pos; ++k) close_doc(starts[k] == pos);
      }
      XXH3_64bits_update(state, &v, sizeof v);
      last = v;
    }
  }
  if (find) {
    close_doc(false);
  } else {
    for (; k < starts.size(); ++k) close_doc(starts[k] == n);
  }
  XXH3_freeState(state);
  scan.starts = std::move(starts);
  scan.starts.push_back(n);
  return scan;
}

// The split of the scanned stream: its parts and document records.
std::unique_ptr<ShardSet> split_of(const Stream& s, const Scan& scan, DatasetMeta meta,
                                   const ForeignSource& src) {
  const int64_t docs = static_cast<int64_t>(scan.clusters.size());
  int64_t held = 0;
  if (src.held_out > 0) {
    held = std::max<int64_t>(1, std::llround(src.held_out * static_cast<double>(docs)));
    if (held >= docs)
      throw DataError(src.path + ": " + std::to_string(docs) +
                      " document(s): too few to hold some out for validation; HINT: set "
                      "data.val_path to a separate file of the same format");
  }
  const bool val = src.split == "val";
  const int64_t first = val ? docs - held : 0, end = val ? docs : docs - held;
  const int64_t lo = scan.starts[first], hi = scan.starts[end];
  // Each document has one boundary token: llm.c's delimiter before it, Megatron's end-of-document
  // token after it. A record holds the rest, as keel's own index does.
  const int64_t lead = src.format == config::DataSource::kLlmc ? 1 : 0;
  std::vector<IndexRecord> index;
  index.reserve(end - first);
  for (int64_t k = first; k < end; ++k) {
    const int64_t length = scan.starts[k + 1] - scan.starts[k] - 1;
    if (length < 1) continue;
    index.push_back({static_cast<uint64_t>(scan.starts[k] + lead - lo), static_cast<uint64_t>(k),
                     static_cast<uint32_t>(std::min<int64_t>(length, UINT32_MAX)),
                     scan.clusters[k]});
  }
  return ShardSet::from_parts(s.dir, src.split, std::move(meta), slice(s, lo, hi),
                              std::move(index));
}

std::unique_ptr<ShardSet> whole_stream(const Stream& s, int64_t vocab_size,
                                       config::DataSource format) {
  return ShardSet::from_parts(s.dir, "all", stream_meta(s, vocab_size, 0, format), s.parts, {});
}

std::string parent_dir(const std::string& file) {
  const fs::path parent = fs::path(file).parent_path();
  return parent.empty() ? "." : parent.string();
}

// A keel dataset (its meta.json beside the path) given to the Megatron or llm.c reader: the read
// would fail on a missing .idx or on the magic of a keel shard ("KEEL"); say what it is instead.
void refuse_keel_dataset(config::DataSource format, const std::string& path) {
  std::error_code ec;
  fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::exists(dir / "meta.json", ec)) return;
  throw DataError(path + ": a dataset `keel prepare` wrote (" + (dir / "meta.json").string() +
                  "), not " +
                  (format == config::DataSource::kMegatron ? "a Megatron .bin/.idx pair"
                                                           : "llm.c .bin shards") +
                  "; HINT: set data.source: shards to train on it");
}

Stream megatron_stream(const std::string& prefix, MegatronIndex& index) {
  auto idx = std::make_shared<const MappedFile>(prefix + ".idx", kMegatronHint);
  index = parse_megatron_index(idx->data(), idx->size(), idx->path());
  auto bin = std::make_shared<const MappedFile>(prefix + ".bin", kMegatronHint);
  if (bin->size() != static_cast<uint64_t>(index.tokens) * index.token_bytes)
    fail(bin->path(),
         std::to_string(bin->size()) + " bytes, but " + prefix + ".idx describes " +
             std::to_string(index.tokens) + " tokens of " + std::to_string(index.token_bytes) +
             " bytes (" + std::to_string(index.tokens * index.token_bytes) + ")",
         kMegatronHint);
  Stream s;
  s.dir = parent_dir(prefix);
  s.token_bytes = index.token_bytes;
  add_part(s, std::move(bin), 0, index.tokens);
  return s;
}

Stream llmc_stream(const std::string& path) {
  Stream s;
  const auto files = llmc_files(path);
  s.dir = parent_dir(files.front());
  for (size_t i = 0; i < files.size(); ++i) {
    auto file = std::make_shared<const MappedFile>(files[i], kLlmcHint);
    const LlmcHeader h = parse_llmc_header(file->data(), file->size(), file->path());
    if (i == 0) s.token_bytes = h.token_bytes;
    if (h.token_bytes != s.token_bytes)
      fail(file->path(),
           std::to_string(h.token_bytes) + "-byte tokens, but " + files.front() + " has " +
               std::to_string(s.token_bytes) + "-byte tokens",
           "every shard of one source must come from the same tokenizer");
    add_part(s, std::move(file), kLlmcHeaderBytes, h.tokens);
  }
  if (s.tokens == 0)
    fail(path, "the shards hold no tokens", "point data.path at shards that hold data");
  return s;
}

}  // namespace

MegatronIndex parse_megatron_index(const uint8_t* data, size_t size, const std::string& path) {
  if (size < kMegatronHeaderBytes)
    fail(path, std::to_string(size) + " bytes, shorter than the 34-byte MMIDIDX header",
         kMegatronHint);
  if (std::memcmp(data, kMegatronMagic, sizeof kMegatronMagic) != 0)
    fail(path, at_byte(0) + "not a Megatron MMIDIDX index (its magic differs)", kMegatronHint);
  if (const auto version = load<uint64_t>(data + 9); version != 1)
    fail(path, at_byte(9) + "index version " + std::to_string(version) + ", keel reads version 1",
         kMegatronHint);
  MegatronIndex index;
  const uint8_t dtype = data[17];
  if (dtype == 8) {
    index.token_bytes = 2;
  } else if (dtype == 4) {
    index.token_bytes = 4;
  } else {
    fail(path,
         at_byte(17) + "token dtype code " + std::to_string(dtype) +
             "; keel reads 8 (uint16) and 4 (int32), the types Megatron writes for text",
         kMegatronHint);
  }
  const uint64_t sequences = load<uint64_t>(data + 18), entries = load<uint64_t>(data + 26);
  const uint64_t body = size - kMegatronHeaderBytes;
  if (sequences > body / 12 || entries > body / 8 || sequences * 12 + entries * 8 != body) {
    const bool modes =
        sequences <= body / 13 && entries <= body / 8 && sequences * 13 + entries * 8 == body;
    fail(path,
         at_byte(18) + std::to_string(sequences) + " sequences and " + std::to_string(entries) +
             " document-index entries do not match the file's " + std::to_string(size) + " bytes" +
             (modes ? " (it carries sequence modes: a multimodal index; keel reads text)" : ""),
         kMegatronHint);
  }
  const uint8_t* sizes = data + kMegatronHeaderBytes;
  const uint8_t* pointers = sizes + sequences * 4;
  const uint8_t* docs = pointers + sequences * 8;
  std::vector<int64_t> seq_start(sequences + 1, 0);
  for (uint64_t i = 0; i < sequences; ++i) {
    const auto n = load<int32_t>(sizes + 4 * i);
    if (n < 0)
      fail(path,
           at_byte(sizes + 4 * i - data) + "sequence " + std::to_string(i) + " has size " +
               std::to_string(n),
           kMegatronHint);
    const auto pointer = load<int64_t>(pointers + 8 * i);
    if (pointer != seq_start[i] * index.token_bytes)
      fail(path,
           at_byte(pointers + 8 * i - data) + "sequence " + std::to_string(i) + " points at byte " +
               std::to_string(pointer) + " of the .bin, its predecessors end at byte " +
               std::to_string(seq_start[i] * index.token_bytes),
           kMegatronHint);
    seq_start[i + 1] = seq_start[i] + n;
  }
  index.tokens = seq_start[sequences];
  for (uint64_t k = 0; k < entries; ++k) {
    const auto d = load<int64_t>(docs + 8 * k);
    const int64_t before = k == 0 ? -1 : load<int64_t>(docs + 8 * (k - 1));
    const bool bad = k == 0 ? d != 0 : (d < before || d > static_cast<int64_t>(sequences));
    if (bad || (k + 1 == entries && d != static_cast<int64_t>(sequences)))
      fail(path,
           at_byte(docs + 8 * k - data) + "document index entry " + std::to_string(k) + " is " +
               std::to_string(d) + "; entries must not fall, from 0 to the sequence count (" +
               std::to_string(sequences) + ")",
           kMegatronHint);
    if (k + 1 < entries) index.doc_starts.push_back(seq_start[d]);
  }
  if (entries < 2 || index.tokens == 0)
    fail(path, "the index holds no document with tokens", kMegatronHint);
  return index;
}

LlmcHeader parse_llmc_header(const uint8_t* data, size_t size, const std::string& path) {
  if (size < kLlmcHeaderBytes)
    fail(path, std::to_string(size) + " bytes, shorter than llm.c's 1024-byte header", kLlmcHint);
  const auto magic = load<int32_t>(data), version = load<int32_t>(data + 4);
  const auto count = load<int32_t>(data + 8);
  LlmcHeader h;
  if (magic == kLlmcMagicU16 && version == 1) {
    h.token_bytes = 2;
  } else if (magic == kLlmcMagicU32 && version == 7) {
    h.token_bytes = 4;
  } else {
    fail(path,
         at_byte(0) + "magic " + std::to_string(magic) + " version " + std::to_string(version) +
             "; llm.c writes 20240520 version 1 (uint16 tokens) or 20240801 version 7 (uint32)",
         kLlmcHint);
  }
  if (count < 0 || static_cast<uint64_t>(count) * h.token_bytes != size - kLlmcHeaderBytes)
    fail(path,
         at_byte(8) + "the header says " + std::to_string(count) + " tokens of " +
             std::to_string(h.token_bytes) + " bytes, the file holds " +
             std::to_string(size - kLlmcHeaderBytes) + " bytes after the header",
         kLlmcHint);
  h.tokens = count;
  return h;
}

std::vector<std::string> llmc_files(const std::string& path) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec) && e.path().extension() == ".bin") files.push_back(e.path());
  } else if (path.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    if (::glob(path.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
  } else if (fs::exists(path, ec)) {
    files.push_back(path);
  }
  if (files.empty())
    fail(path, "matches no llm.c .bin shard",
         "data.path is a shard, a directory of shards, or a pattern such as "
         "data/fineweb_train_*.bin");
  std::sort(files.begin(), files.end());
  return files;
}

std::string megatron_prefix(const std::string& path) {
  const fs::path p(path);
  if (p.extension() == ".bin" || p.extension() == ".idx")
    return (p.parent_path() / p.stem()).string();
  return path;
}

std::unique_ptr<ShardSet> open_foreign(const ForeignSource& src) {
  if (src.vocab_size < 1)
    throw ConfigError("model.vocab_size: pre-tokenized data (data.source " +
                      std::string(config::name_of(src.format)) +
                      ") does not record its vocabulary; give the tokenizer's size");
  const bool megatron = src.format == config::DataSource::kMegatron;
  refuse_keel_dataset(src.format, src.path);
  MegatronIndex index;
  const Stream s =
      megatron ? megatron_stream(megatron_prefix(src.path), index) : llmc_stream(src.path);
  const auto whole = whole_stream(s, src.vocab_size, src.format);
  int64_t delimiter = -1;
  if (!megatron) whole->read(0, 1, &delimiter);
  const Scan scan = scan_stream(*whole, src.vocab_size, std::move(index.doc_starts), delimiter);
  // The boundary sample decoding shows: llm.c's delimiter, or the token every Megatron document
  // ends with (preprocess_data.py --append-eod).
  const int64_t boundary = megatron ? std::max<int64_t>(scan.common_last, 0) : delimiter;
  if (src.split == "train")
    log::info(
        "data", "{} ({}): {} tokens of {} bytes in {} file(s), {} documents{}", src.path,
        config::name_of(src.format), s.tokens, s.token_bytes, s.parts.size(), scan.clusters.size(),
        megatron
            ? (scan.common_last >= 0 ? ", each ending with id " + std::to_string(scan.common_last)
                                     : ", with no common end-of-document token")
            : ", each opened by id " + std::to_string(delimiter));
  return split_of(s, scan,
                  stream_meta(s, src.vocab_size, static_cast<uint32_t>(boundary), src.format), src);
}

ForeignSummary summarize_foreign(config::DataSource format, const std::string& path) {
  refuse_keel_dataset(format, path);
  ForeignSummary out;
  if (format == config::DataSource::kMegatron) {
    MegatronIndex index;
    const Stream s = megatron_stream(megatron_prefix(path), index);
    out.files = 1;
    out.tokens = s.tokens;
    out.documents = static_cast<int64_t>(index.doc_starts.size());
    out.token_bytes = s.token_bytes;
    return out;
  }
  const Stream s = llmc_stream(path);
  out.files = static_cast<int64_t>(llmc_files(path).size());
  out.tokens = s.tokens;
  out.token_bytes = s.token_bytes;
  return out;
}

}  // namespace keel::data
